package relocation_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/extension/relocation/handoff"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/messages"
)

// The source resends the whole boundary batch and the cutover — every
// cutover wait, and at once when its connection to the target ends — until
// the target acknowledges the batch. Here the first acknowledgement is lost
// and the endpoint is cut after the move: the resent batch reaches a target
// that already merged it; it takes nothing twice, logs late_cutover and
// acknowledges again.
// Reference: spec 000 §4.4, §9 (cutover lost, source running), §13.
func TestUnacknowledgedBoundaryBatchIsResent(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	kind := relocation.Kind{StableType: "ledger", Producer: func() actor.Actor { return newLedger() }, Policy: relocation.PreserveStateWith(ledgerState{})}
	a := startNodeWith(t, store, kind)
	b := startNodeConfig(t, store, relocation.Config{Logger: logs.logger()}, kind)
	var acks atomic.Int32
	relocation.DropInbound(a.driver, func(m any) bool {
		_, ok := m.(*messages.BoundaryAck)
		return ok && acks.Add(1) == 1
	})
	ctx := context.Background()
	key := location.Key(location.KindActor, "cut")
	pid, err := a.driver.Spawn(ctx, "ledger", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	// Messages queued behind a held turn become saved work; those sent while
	// sealed form the boundary batch. Nothing is sent after the cutover, so
	// every message is in the payload or the batch, both protected.
	const total = 3000
	for i := uint64(1); i <= total/2; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	for i := uint64(total/2 + 1); i <= total; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	require.NoError(t, <-moved)
	// Cut the source's connection to the target, as a network failure would.
	a.node.System().EventStream.Publish(&remote.EndpointTerminatedEvent{Address: b.node.Address()})

	testwait.For(t, func() bool { return logs.has("late_cutover") && acks.Load() >= 2 }, "the resent batch was never acknowledged")
	l := ledgerStats(t, b, key)
	require.Zero(t, l.DupSends, "a resent record was taken twice")
	require.EqualValues(t, total, l.Count[0])
}

// A link cut across the cutover for longer than Message Follow: the target
// commits by its cutover-wait fallback without the boundary batch, and the
// batch arrives only after the cut heals, by the source's resends — which
// go on until the target acknowledges the batch, not only while Message
// Follow lasts. Every message is handled once (order between the late
// batch and later messages is not guaranteed on this path, spec 000 §4.4).
// Reference: spec 000 §4.4 (fallback, resend), §9 (cutover lost).
func TestBoundaryBatchReachesATargetThatFellBackDuringALongCut(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	hc := handoff.DefaultConfig()
	hc.CutoverWaitTimeout = 200 * time.Millisecond
	hc.FollowDuration = 50 * time.Millisecond
	hc.BoundaryAckPatience = time.Minute
	kind := relocation.Kind{StableType: "ledger", Producer: func() actor.Actor { return newLedger() }, Policy: relocation.PreserveStateWith(ledgerState{})}
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger(), Handoff: hc}, kind)
	b := startNodeConfig(t, store, relocation.Config{Logger: logs.logger(), Handoff: hc}, kind)
	// Every relayed record and cutover is lost until a resent cutover of
	// epoch 2 went into the cut: by then two cutover waits passed since the
	// cutover, far past Message Follow.
	var cut atomic.Bool
	cut.Store(true)
	var resentLost atomic.Int32
	relocation.DropInbound(b.driver, func(m any) bool {
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
	ctx := context.Background()
	key := location.Key(location.KindActor, "long-cut")
	pid, err := a.driver.Spawn(ctx, "ledger", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	const total = 2000
	for i := uint64(1); i <= total/2; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	for i := uint64(total/2 + 1); i <= total; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	require.NoError(t, <-moved)
	testwait.For(t, func() bool { return resentLost.Load() > 0 }, "no resend went into the cut")
	require.True(t, logs.has("cutover_timeout"), "the target committed by its fallback")
	cut.Store(false)

	testwait.For(t, func() bool { return ledgerStats(t, b, key).Count[0] == total }, "the boundary batch never reached the target")
	l := ledgerStats(t, b, key)
	require.Zero(t, l.DupSends, "a record was taken twice")
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
