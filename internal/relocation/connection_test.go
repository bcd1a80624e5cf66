package relocation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The source resends the whole boundary batch and the cutover — every
// cutover wait, and at once when its connection to the target ends — until
// the target acknowledges the batch. Here the first acknowledgement is lost
// and the endpoint is cut after the move: the resent batch reaches a target
// that already merged it; it takes nothing twice, logs late_cutover and
// acknowledges again.
// Reference: docs/PROTOCOL.md §5.9 (cutover lost, source running), §12.1
// items 13 and 24.
func TestUnacknowledgedBoundaryBatchIsResent(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	alogs := &logBuffer{}
	a := startNodeConfig(t, store, relocation.Config{Logger: alogs.logger()}, ledgerKind)
	b := startNodeConfig(t, store, relocation.Config{Logger: logs.logger()}, ledgerKind)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("source:\n%s\ntarget:\n%s", alogs, logs)
		}
	})
	var acks atomic.Int32
	onInbound(t, a.driver, func(m any) bool {
		_, ok := m.(*messages.BoundaryAck)
		return ok && acks.Add(1) == 1
	})
	key := location.Key(location.KindActor, "cut")
	const total = 3000
	batch, err := moveAmidSends(t, a, b, key, total)
	require.NoError(t, err)
	// The sends after the move reach b by Message Follow, one hop behind
	// the direct stats request: wait for the last of them before the cut
	// (a one-way send on its way in a connection that is cut is lost by
	// the transport: docs/FAULTS.md).
	var l ledger
	testwait.For(t, func() bool { l = ledgerStats(t, b, key); return l.Count[0] >= total }, "every send handled at the target")
	// Cut the source's connection to the target, as a network failure would.
	a.node.System().EventStream.Publish(&remote.EndpointTerminatedEvent{Address: b.node.Address()})

	testwait.For(t, func() bool { return logs.has("late_cutover") && acks.Load() >= 2 }, "the resent batch was never acknowledged")
	l = ledgerStats(t, b, key)
	require.Zero(t, l.DupSends, "a resent record was taken twice")
	require.Zero(t, l.Disorder)
	require.EqualValues(t, total, l.Count[0])
	require.Equal(t, total/2, batch.records(), "the second half travelled in the boundary batch")
}

// A link cut across the cutover for longer than Message Follow: the target
// commits by its cutover-wait fallback without the boundary batch, and the
// batch arrives only after the cut heals, by the source's resends — which
// go on until the target acknowledges the batch, not only while Message
// Follow lasts. Every message is handled once (order between the late
// batch and later messages is not guaranteed on this path:
// PROTOCOL.md §5.10).
// Reference: PROTOCOL.md §5.9 (resend), §5.10 (fallback).
func TestBoundaryBatchReachesATargetThatFellBackDuringALongCut(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	hc := handoff.DefaultConfig()
	hc.CutoverWaitTimeout = 200 * time.Millisecond
	hc.FollowDuration = 50 * time.Millisecond
	hc.BoundaryAckPatience = time.Minute
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger(), Handoff: hc}, ledgerKind)
	b := startNodeConfig(t, store, relocation.Config{Logger: logs.logger(), Handoff: hc}, ledgerKind)
	// Every relayed record and cutover is lost until a resent cutover of
	// epoch 2 went into the cut: by then two cutover waits passed since the
	// cutover, far past Message Follow.
	var cut atomic.Bool
	cut.Store(true)
	var resentLost atomic.Int32
	onInbound(t, b.driver, func(m any) bool {
		if !cut.Load() {
			return false
		}
		switch m := m.(type) {
		case *messages.RelayedRecord:
			return true
		case *messages.Cutover:
			if m.GetResendEpoch() >= 2 {
				resentLost.Add(1)
			}
			return true
		}
		return false
	})
	key := location.Key(location.KindActor, "long-cut")
	const total = 2000
	batch, err := moveAmidSends(t, a, b, key, total)
	require.NoError(t, err)
	testwait.For(t, func() bool { return resentLost.Load() > 0 }, "no resend went into the cut")
	require.True(t, logs.has("cutover_timeout"), "the target committed by its fallback")
	cut.Store(false)

	testwait.For(t, func() bool { return ledgerStats(t, b, key).Count[0] == total }, "the boundary batch never reached the target")
	l := ledgerStats(t, b, key)
	require.Zero(t, l.DupSends, "a record was taken twice")
	require.Empty(t, l.Gaps[0], "a record was never taken")
	require.Equal(t, total/2, batch.records(), "the second half travelled in the boundary batch, after the cut healed")
}

// moveAmidSends spawns a ledger as key on a and moves it to b while total
// numbered sends go to it: the first half before the move (handled on a,
// or saved work), the second half while the move is held at b's Restore
// request, sealed, so that they can only travel in the boundary batch. Nothing is
// sent after the cutover, so every send is in the payload or the batch.
// It returns Relocate's error and a count of the boundary records that
// reach b (behind the hooks a test added to b before).
func moveAmidSends(t *testing.T, a, b *testNode, key location.AuthorityKey, total int) (*batchWatch, error) {
	t.Helper()
	sealed := holdAtPrepare(t, b)
	batch := watchBatch(t, b)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "ledger", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	for i := 1; i <= total/2; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	sealed.wait(t)
	for i := total/2 + 1; i <= total; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	sealed.release()
	return batch, <-moved
}

// ledgerStats asks the ledger behind key, through its owner b.
func ledgerStats(t *testing.T, b *testNode, key location.AuthorityKey) ledger {
	t.Helper()
	direct, err := b.driver.Resolve(context.Background(), key)
	require.NoError(t, err)
	res, err := b.node.System().Root.RequestFuture(direct, wrapperspb.String("stats"), 10*time.Second).Result()
	require.NoError(t, err)
	var l ledger
	require.NoError(t, json.Unmarshal(res.(*wrapperspb.BytesValue).Value, &l))
	return l
}

// The target's OwnerCommitted only spares the source a watch: when it is
// lost, the source watches the record past the version the relay-ready
// named, and the move confirms all the same.
// Reference: docs/PROTOCOL.md §5.7 (relay-ready's version hint).
func TestCommitConfirmedWithoutTheTargetsNotice(t *testing.T) {
	// As a store behind a network (on an in-process one the source
	// watches at no cost and no notice is sent).
	store := remoteStore{newStore(t)}
	a := startNodeWith(t, store, counterKind)
	b := startNodeWith(t, store, counterKind)
	var dropped atomic.Int32
	relocation.DropInbound(a.driver, func(m any) bool {
		_, ok := m.(*messages.OwnerCommitted)
		if ok {
			dropped.Add(1)
		}
		return ok
	})
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		key := location.Key(location.KindActor, fmt.Sprintf("unnoticed-%d", i))
		_, err := a.driver.Spawn(ctx, "counter", key.ID)
		require.NoError(t, err)
		out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		require.NoError(t, err)
		require.False(t, out.Committed.IsZero())
		v, err := store.Read(ctx, key)
		require.NoError(t, err)
		require.Equal(t, b.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid())
		require.Equal(t, out.RelocationID, v.Record.GetRelocationId())
	}
	require.EqualValues(t, 3, dropped.Load(), "the target sent its notice")
}

// remoteStore hides a store's location.InProcess.
type remoteStore struct{ location.Store }

// A drained node about to stop tells its peers (Leaving): each stops
// sending to it by a cached route or a Message Follow hop — it reads the
// owner from the store instead — before it answers, so a send after the
// leaving node's transport shut down is never dropped by the transport.
// The mark names the leaving lifecycle: a node started again under the
// same address (a rolling restart on fixed ports) is sent to as usual.
// Reference: docs/FAULTS.md, "Routes to a node that has left".
func TestLeavingNodeIsNoLongerSentTo(t *testing.T) {
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	b := startNodeWith(t, store, counterKind)
	addr, rid := a.node.Address(), a.node.Descriptor().GetNodeRid()
	require.False(t, b.driver.Departed(addr, rid))
	require.NoError(t, a.driver.Leaving(context.Background(), b.node.Address()))
	require.True(t, b.driver.PeerLeaving(addr, rid), "answered before it stopped sending to the leaving node")
	require.True(t, b.driver.Departed(addr, rid))
	require.True(t, b.driver.PeerLeaving(addr, ""), "whichever lifecycle is there, for a sender that does not know")
	require.False(t, b.driver.PeerLeaving(addr, "another-lifecycle"), "a later lifecycle at the address is not leaving")
	require.False(t, b.driver.Departed(addr, "another-lifecycle"))
	require.False(t, a.driver.Departed(b.node.Address(), b.node.Descriptor().GetNodeRid()), "only the leaving node is left")
}

// An operator's release of an ended owner's object on a node that does
// not host its stable type is judged by the live nodes that do: refused
// (InvalidOperation) when one of them recovers such objects by itself —
// the release would forget the state that recovery is about to restore —
// allowed when none hosts the type.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestReleasableEndedIsJudgedByTheNodesThatHostTheKind(t *testing.T) {
	store := newStore(t)
	hosting := func(kinds ...relocation.Kind) *testNode {
		var types []string
		for _, k := range kinds {
			types = append(types, k.StableType)
		}
		return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), StableTypes: types}, relocation.Config{Logger: testLogger()}, kinds...)
	}
	host := hosting(relayKind, counterKind)
	bystander := hosting()
	key := location.Key(location.KindActor, "ended-one")
	ctx := context.Background()

	require.ErrorIs(t, host.driver.ReleasableEnded(ctx, "relay", key), roamerr.ErrInvalidOperation, "a stateless kind comes back by itself")
	require.ErrorIs(t, bystander.driver.ReleasableEnded(ctx, "relay", key), roamerr.ErrInvalidOperation,
		"judged by the node that hosts the kind, not by the bystander's lack of it")
	local := host.driver.ReleasableEnded(ctx, "counter", key)
	remote := bystander.driver.ReleasableEnded(ctx, "counter", key)
	require.Equal(t, local == nil, remote == nil, "the bystander judges as the host does (host: %v, bystander: %v)", local, remote)
	require.NoError(t, bystander.driver.ReleasableEnded(ctx, "hosted-nowhere", key), "no live node would recover it")
}

// Sends to an ended incarnation are all counted and all accounted for in
// the log, but not a line each: the first is logged, then a line a second
// with how many more (more_sends). A store outage under load wrote a
// line per send before (267,759 in 25 s of the chat).
func TestSendsToAnEndedIncarnationAreLoggedInSummary(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	a := startNodeConfig(t, store, relocation.Config{Logger: logs.logger()}, counterKind)
	sink := relocation.EndSinkFor(a.driver, location.Key(location.KindActor, "gone"), "send_test_ended")
	const n = 500
	for i := range n {
		sink(&actor.MessageEnvelope{Message: wrapperspb.Int64(int64(i))})
	}
	counted := func() (lines, sends int) {
		for _, line := range logs.lines("send_test_ended") {
			var ev struct {
				More int `json:"more_sends"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &ev))
			lines++
			sends += max(1, ev.More) // a summary line stands for its more_sends
		}
		return lines, sends
	}
	// What is held back for the next line is written on demand (a node's
	// stop, before its process may exit), not only by the timer.
	a.driver.FlushSendLogs()
	lines, sends := counted()
	require.Equal(t, n, sends, "every send accounted for in the log")
	require.Less(t, lines, 10, "not a line per send")
}
