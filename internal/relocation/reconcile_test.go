package relocation_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// silentTarget is a node whose relocation actor says it hosts everything
// and then never answers a Restore request: the source gets no reply.
type silentTarget struct {
	node     *meshnode.Node
	mu       sync.Mutex
	prepare  *messages.RelocationPrepare
	prepared chan struct{}
}

func (s *silentTarget) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.CapabilityQuery:
		c.Respond(&messages.CapabilityReply{Supported: true, ReceiveChunkLimit: 256 << 10})
	case *messages.RelocationPrepare:
		s.mu.Lock()
		if s.prepare == nil {
			s.prepare = m
			close(s.prepared)
		}
		s.mu.Unlock()
	}
}

func startSilentTarget(t *testing.T, store location.Store) *silentTarget {
	node, err := meshnode.Start(context.Background(), meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	s := &silentTarget{node: node, prepared: make(chan struct{})}
	_, err = node.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return s }), relocation.DriverName)
	require.NoError(t, err)
	return s
}

// tell sends a control message to the source's driver from this node's
// relocation actor, as the move's target would.
func (s *silentTarget) tell(source *testNode, msg proto.Message) {
	self := actor.NewPID(s.node.Address(), relocation.DriverName)
	s.node.System().Root.RequestWithCustomSender(relocation.PID(source.node.Address()), msg, self)
}

// With no reply by the restore deadline the source reconciles: while the
// store still names it, requests fail Unavailable at once and sends wait;
// an explicit failure that arrives then restores the source with the saved
// work and the waiting sends, each handled once, in order.
// Reference: docs/PROTOCOL.md §6.4, §6.2 (explicit failure before relay-ready).
func TestNoReplyReconcilesThenExplicitFailureRestores(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	silent := startSilentTarget(t, store)
	ctx := context.Background()
	key := location.Key(location.KindActor, "rc1")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	for i := int64(1); i <= 100; i++ {
		root.Send(pid, wrapperspb.Int64(i))
	}
	_, err = a.driver.Relocate(ctx, key, silent.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)

	res, err := root.RequestFuture(pid, wrapperspb.String("get"), 10*time.Second).Result()
	require.NoError(t, err)
	require.ErrorIs(t, relocation.DeliveryError(res), roamerr.ErrUnavailable, "a request fails at once while reconciling")
	for i := int64(101); i <= 150; i++ {
		root.Send(pid, wrapperspb.Int64(i))
	}

	<-silent.prepared
	silent.tell(a, &messages.RelocationFailed{Identity: silent.prepare.GetIdentity(), Reason: messages.FailureReason_FAILURE_REASON_RESTORE_FAILED})
	waitServing(t, a, key, true, "the source never reopened")
	require.Equal(t, int64(150), get(t, root.ActorSystem(), pid))
}

// If reconciliation finds that the target did commit (its relay-ready was
// lost), the source adopts the target route and forwards the sends that
// waited, in order.
// Reference: PROTOCOL.md §6.4.
func TestReconcileAdoptsACommittedTarget(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	silent := startSilentTarget(t, store)
	ctx := context.Background()
	key := location.Key(location.KindActor, "rc2")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root

	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, silent.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	<-silent.prepared
	// The next incarnation on the silent node counts what reaches it.
	got := make(chan int64, 100)
	spawned, err := store.Read(ctx, key)
	require.NoError(t, err)
	name := fmt.Sprintf("roam/actor/%s@%d.2", key.ID, spawned.Record.GetObjectGeneration())
	_, err = silent.node.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(*wrapperspb.Int64Value); ok {
			got <- v.Value
		}
	}), name)
	require.NoError(t, err)
	for i := int64(1); i <= 20; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // held: the source is sealed
	}
	// The target commits before its restore deadline, as if its relay-ready
	// had been lost: the source hears nothing and reconciles at the deadline.
	v, err := store.Read(ctx, key)
	require.NoError(t, err)
	id := handoff.IdentityFromProto(silent.prepare.GetIdentity())
	r := v.Record
	r.Owner = &messages.Owner{Mesh: meshnode.DefaultMesh, NodeRid: silent.node.Descriptor().GetNodeRid(), NodeGeneration: silent.node.Descriptor().GetNodeGeneration()}
	r.AuthorityOwnerGeneration, r.RelocationId = 2, id.RelocationID
	_, err = store.CompareAndSet(ctx, key, v.Version, r)
	require.NoError(t, err)
	require.NoError(t, <-moved, "reconciliation finds the commit")

	for i := int64(1); i <= 20; i++ {
		select {
		case v := <-got:
			require.Equal(t, i, v)
		case <-time.After(testwait.Patience(t)):
			t.Fatalf("held send %d never reached the committed target", i)
		}
	}
}

// A target that stays silent and never commits does not leave the object
// unavailable: past the target's restore deadline the source fences the
// move out in the store (the record keeps its owner and carries the move's
// RelocationId), so no CAS of that target can apply any more; then the
// source serves again with the sends that waited, in order, and the move
// is over (its budget released). A target CAS that arrives after the
// fence-out fails.
// Reference: PROTOCOL.md §6.4, §6.5, §6.7 (the one backward edge).
func TestSilentTargetIsFencedOutAndTheSourceServesAgain(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	silent := startSilentTarget(t, store)
	ctx := context.Background()
	key := location.Key(location.KindActor, "rc3")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	before, err := store.Read(ctx, key)
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, key, silent.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	for i := int64(1); i <= 30; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // parked while reconciling
	}
	waitServing(t, a, key, true, "the source never served again")
	require.Equal(t, int64(30), get(t, root.ActorSystem(), pid), "every parked send handled once, in order")
	<-silent.prepared
	after, err := store.Read(ctx, key)
	require.NoError(t, err)
	id := handoff.IdentityFromProto(silent.prepare.GetIdentity())
	require.Equal(t, a.node.Descriptor().GetNodeRid(), after.Record.GetOwner().GetNodeRid(), "the owner never changed")
	require.Equal(t, id.RelocationID, after.Record.GetRelocationId(), "the move is fenced out")
	// The silent target's CAS, prepared on the record it could have read
	// before the fence-out, cannot apply.
	late := before.Record
	late.Owner = &messages.Owner{Mesh: meshnode.DefaultMesh, NodeRid: silent.node.Descriptor().GetNodeRid(), NodeGeneration: silent.node.Descriptor().GetNodeGeneration()}
	late.AuthorityOwnerGeneration, late.RelocationId = 2, id.RelocationID
	_, err = store.CompareAndSet(ctx, key, before.Version, late)
	require.ErrorIs(t, err, location.ErrConflict)
	// The move is over on the source: the object moves on normally.
	b := startNodeConfig(t, store, relocation.Config{}, counterKind)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
}

// A target lost between relay-ready and its commit (here: it replies
// relay-ready, then its node stops without committing, as after a crash)
// does not leave the object with a source that only forwards to a node
// that is gone: past the target's restore deadline the source fences the
// move out and serves again from what it held — state, the saved work and
// the boundary batch, each handled once, in order — and Relocate reports
// the move as not made.
// Reference: PROTOCOL.md §6.5 (a target lost), docs/FAULTS.md ("A target
// lost after relay-ready").
func TestTargetLostAfterRelayReadyIsFencedOutAndTheSourceServesAgain(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	silent := startSilentTarget(t, store)
	ctx := context.Background()
	key := location.Key(location.KindActor, "rc4")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	for i := int64(1); i <= 50; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // state or saved work
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, silent.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	<-silent.prepared // the source sealed and captured
	for i := int64(51); i <= 70; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // the ingress hold: the boundary batch
	}
	silent.tell(a, &messages.RelayReady{Identity: silent.prepare.GetIdentity()})
	// The source relays and sends the cutover; the target is gone.
	waitServing(t, a, key, false, "the source never cut over")
	for i := int64(71); i <= 90; i++ {
		// After the cutover: held until the move is decided, never followed
		// to a target whose commit is not known (it would strand them
		// there, and they would come back only by dead-letter redelivery,
		// behind later sends).
		root.Send(pid, wrapperspb.Int64(i))
	}
	require.NoError(t, silent.node.Stop(ctx))

	waitServing(t, a, key, true, "the source never served again")
	err = <-moved
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "the move was not made")
	require.Contains(t, err.Error(), "fenced out", "Relocate says why")
	require.Equal(t, int64(90), get(t, root.ActorSystem(), pid), "state, saved work, boundary batch and what was held after the cutover, each once, in order")
	root.Send(pid, wrapperspb.Int64(91))
	require.Equal(t, int64(91), get(t, root.ActorSystem(), pid), "the reinstated incarnation serves new messages")
	after, err := store.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, a.node.Descriptor().GetNodeRid(), after.Record.GetOwner().GetNodeRid(), "the owner never changed")
	require.Equal(t, handoff.IdentityFromProto(silent.prepare.GetIdentity()).RelocationID, after.Record.GetRelocationId(), "the move is fenced out")
	// The move is over on the source: the object moves on normally, with
	// its state.
	b := startNodeConfig(t, store, relocation.Config{}, counterKind)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, int64(91), get(t, root.ActorSystem(), pid), "followed to the new owner, state kept")
}

// waitServing waits until n's driver reports key as served (want true) or
// not (want false); msg says what never happened.
func waitServing(t *testing.T, n *testNode, key location.AuthorityKey, want bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(testwait.Patience(t))
	for {
		ok, err := n.driver.Serving(context.Background(), key)
		require.NoError(t, err)
		if ok == want {
			return
		}
		require.True(t, time.Now().Before(deadline), msg)
		time.Sleep(10 * time.Millisecond)
	}
}

// refuseWrites is a node's view of the store that, while on, refuses
// every write touching one object's record (Unavailable, not applied).
type refuseWrites struct {
	location.Store
	key location.AuthorityKey
	on  atomic.Bool
}

func (r *refuseWrites) touches(ops []location.Op) bool {
	for _, op := range ops {
		if op.Key == r.key {
			return true
		}
	}
	return false
}

func (r *refuseWrites) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if r.on.Load() && r.touches(ops) {
		return nil, fmt.Errorf("%w: writes of %s refused by the test", location.ErrUnavailable, r.key)
	}
	return r.Store.Apply(ctx, ops)
}

func (r *refuseWrites) CompareAndSet(ctx context.Context, key location.AuthorityKey, v location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	if r.on.Load() && key == r.key {
		return 0, fmt.Errorf("%w: writes of %s refused by the test", location.ErrUnavailable, r.key)
	}
	return r.Store.CompareAndSet(ctx, key, v, rec)
}

// A move retried at once after a fence-out, to the same target, is made:
// the target removed by the fenced-out move keeps its incarnation's PID
// for one Message Follow period (30 s), and the retry's incarnation must
// not need that name.
func TestAMoveRetriedAtOnceAfterAFenceOutIsMade(t *testing.T) {
	shared := newStore(t)
	key := location.Key(location.KindActor, "retry")
	view := &refuseWrites{Store: shared, key: key}
	cfg := relocation.Config{RestoreTimeout: 2 * time.Second}
	a := startNodeConfig(t, shared, cfg, counterKind)
	b := startNodeConfig(t, view, cfg, counterKind)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	for i := int64(1); i <= 5; i++ {
		root.Send(pid, wrapperspb.Int64(i))
	}
	view.on.Store(true) // the target cannot commit: the move is fenced out
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	waitServing(t, a, key, true, "the source never served again")
	v, err := shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, a.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid(), "the move was fenced out")

	view.on.Store(false)
	out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err, "the retry to the same target")
	v, err = shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, b.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid())
	require.Equal(t, out.RelocationID, v.Record.GetRelocationId())
	root.Send(pid, wrapperspb.Int64(6))
	require.Equal(t, int64(6), get(t, root.ActorSystem(), pid), "state kept; the old address follows to the new owner")
	now, err := b.driver.Resolve(ctx, key)
	require.NoError(t, err)
	require.Equal(t, int64(6), get(t, b.node.System(), now), "the store's record names the serving incarnation")
}

// An owner whose lease the store ended early (Consul destroys a session at
// once when the agent it was created through leaves, whatever its TTL) may
// still count itself valid for up to a TTL after its last renewal. So
// another node takes its descriptor's absence for an ended owner only once
// it has seen it gone for a lease TTL; until then the owner's objects are
// Unavailable, never taken over.
// Reference: PROTOCOL.md §3.4 (ended owners), docs/FAULTS.md ("Lease fencing").
func TestAnOwnerSeenGoneIsEndedOnlyAfterALeaseTTL(t *testing.T) {
	store := newStore(t)
	node, err := meshnode.Start(context.Background(), meshnode.Config{Store: store, Logger: testLogger(), LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	d, err := relocation.New(node, store, relocation.Config{Logger: testLogger()})
	require.NoError(t, err)

	// Another lifecycle whose lease ends at once, as a destroyed session's.
	ctx := context.Background()
	gone := &messages.NodeDescriptor{Mesh: node.Descriptor().GetMesh(), NodeRid: "gone-node", NodeGeneration: 1,
		EntrySpotId: "entry-gone-node", Address: "127.0.0.1:1", ProtocolVersion: node.Descriptor().GetProtocolVersion()}
	ls, err := store.ClaimNode(ctx, gone, 10*time.Second)
	require.NoError(t, err)
	gone.LeaseId = string(ls.ID)
	owner := &messages.Owner{Mesh: gone.GetMesh(), NodeRid: gone.GetNodeRid(), NodeGeneration: 1, LeaseId: gone.GetLeaseId()}
	_, alive, err := d.OwnerNode(ctx, owner)
	require.NoError(t, err)
	require.True(t, alive)
	require.NoError(t, store.ReleaseNode(ctx, gone))

	_, alive, err = d.OwnerNode(ctx, owner)
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "seen gone just now: not yet an ended owner")
	require.False(t, alive)
	testwait.For(t, func() bool {
		_, alive, err := d.OwnerNode(ctx, owner)
		return err == nil && !alive
	}, "the gone owner never counted as ended")
}

// A stopping node's wait for Message Follow to fall quiet also waits for
// every move out of it that still holds messages (here: reconciling after
// a silent target, sends parked): those must reach their owner before the
// node stops. Once the move is decided it returns.
// Reference: docs/OPERATIONS.md (Stop drains, then follows until quiet).
func TestFollowQuietWaitsForHeldMessages(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	silent := startSilentTarget(t, store)
	ctx := context.Background()
	key := location.Key(location.KindActor, "fq1")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	_, err = a.driver.Relocate(ctx, key, silent.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	root.Send(pid, wrapperspb.Int64(1)) // parked while reconciling

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.driver.FollowQuiet(short, 10*time.Millisecond), roamerr.ErrDeadlineExceeded, "quiet while a move holds messages")

	<-silent.prepared
	silent.tell(a, &messages.RelocationFailed{Identity: silent.prepare.GetIdentity(), Reason: messages.FailureReason_FAILURE_REASON_RESTORE_FAILED})
	waitServing(t, a, key, true, "the source never reopened")
	wait, cancel2 := context.WithTimeout(ctx, testwait.Patience(t))
	defer cancel2()
	require.NoError(t, a.driver.FollowQuiet(wait, 10*time.Millisecond))
	require.Equal(t, int64(1), get(t, root.ActorSystem(), pid))
}

// The wait for Message Follow to fall quiet counts from the last move out
// of the node, not only from the last message it followed: a node that
// stops right after its drain must still be there for the sends of
// callers that have not yet heard the moves' route hints. Here no message
// follows at all: right after the move the wait is not over (its context
// ends first), and it ends once the move is a quiet period past.
// Reference: docs/OPERATIONS.md (Stop drains, then follows until quiet).
func TestFollowQuietCountsFromTheLastMoveOut(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	key := location.Key(location.KindActor, "fq2")
	_, err := c.nodes[0].driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	_, err = c.nodes[0].driver.Relocate(ctx, key, c.rid(1))
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.nodes[0].driver.FollowQuiet(short, time.Hour), roamerr.ErrDeadlineExceeded, "quiet at once after a move out")
	wait, cancel2 := context.WithTimeout(ctx, testwait.Patience(t))
	defer cancel2()
	require.NoError(t, c.nodes[0].driver.FollowQuiet(wait, 10*time.Millisecond))
}
