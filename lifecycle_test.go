package roam_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// memberCount is the member count on a User Spot's record.
func memberCount(t *testing.T, store location.Store, spotID string) uint32 {
	t.Helper()
	v, err := store.Read(context.Background(), location.Key(location.KindUserSpot, spotID))
	require.NoError(t, err)
	return v.Record.GetMemberCount()
}

// The Actor lifecycle from any node: members join a User Spot (its record
// counts them), leave it, are deleted; Close keeps a Spot with members and
// closes it once none is left; a deleted Actor's ID is free again.
// Reference: docs/PROTOCOL.md §7.9 (Close and membership), §7.10.
func TestActorLifecycleKeepsTheMemberCount(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		a := start(t, store, roam.WithNodeName("node-a"))
		b := start(t, store, roam.WithNodeName("node-b"))
		club, err := a.Spots().GetOrCreate(ctx, "club", "counter")
		require.NoError(t, err)
		_, err = a.Spots().SpawnMember(ctx, club.Ref, "counter", "m1")
		require.NoError(t, err)
		_, err = b.Spots().SpawnMember(ctx, club.Ref, "counter", "m2")
		require.NoError(t, err)
		require.EqualValues(t, 2, memberCount(t, store, "club"))
		closed, err := a.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.False(t, closed, "members keep the Spot")

		// m1 (on a) leaves, asked from b; then it is an Entry Spot member.
		require.NoError(t, b.LeaveSpot(ctx, roam.ActorRef("m1")))
		require.EqualValues(t, 1, memberCount(t, store, "club"))
		require.ErrorIs(t, a.LeaveSpot(ctx, roam.ActorRef("m1")), roamerr.ErrInvalidOperation, "no longer a User Spot's member")
		n, err := tick(ctx, a, roam.ActorRef("m1"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "it serves on")

		// m2 (on b) is deleted, asked from a.
		n, err = tick(ctx, a, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		deleted, err := a.DeleteActor(ctx, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.True(t, deleted)
		_, err = store.Read(ctx, roam.ActorRef("m2"))
		require.ErrorIs(t, err, location.ErrNotFound)
		require.EqualValues(t, 0, memberCount(t, store, "club"))
		_, err = tick(ctx, a, roam.ActorRef("m2"))
		require.Error(t, err, "a deleted Actor answers nothing")
		deleted, err = b.DeleteActor(ctx, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.False(t, deleted, "already gone")

		closed, err = b.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.True(t, closed, "no member left")

		// The ID is free again: a new, empty Actor.
		_, err = b.SpawnActor(ctx, "counter", "m2")
		require.NoError(t, err)
		n, err = tick(ctx, a, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
}

// An Actor deleted and spawned again under the same ID is a new
// incarnation with a new ObjectGeneration (docs/PROTOCOL.md §2.3): a PID
// of the deleted one reaches nothing of the new one, and a spawn on a node
// where the old incarnation still forwards (it moved away before the
// delete) starts, rather than leaving a record no incarnation serves.
func TestActorSpawnedAgainIsANewIncarnation(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("node-a"))
	b := start(t, store, roam.WithNodeName("node-b"))

	// Deleted where it was spawned, spawned again there.
	_, err := a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	old, err := a.Resolve(ctx, roam.ActorRef("x"))
	require.NoError(t, err)
	first := generationOf(t, store, "x")
	deleted, err := a.DeleteActor(ctx, roam.ActorRef("x"))
	require.NoError(t, err)
	require.True(t, deleted)
	_, err = a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	require.NotEqual(t, first, generationOf(t, store, "x"), "a new incarnation, a new ObjectGeneration")
	res, err := a.System().Root.RequestFuture(old, wrapperspb.String("tick"), testwait.Patience(t)).Result()
	if err == nil {
		require.Error(t, roam.DeliveryError(res), "the deleted incarnation's PID reaches the new one")
	}
	n, err := tick(ctx, a, roam.ActorRef("x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the new incarnation starts empty and got no message meant for the old one")

	// Moved to b (a keeps forwarding for the old PID), deleted there,
	// spawned again on a.
	_, err = a.SpawnActor(ctx, "counter", "y")
	require.NoError(t, err)
	_, err = tick(ctx, a, roam.ActorRef("y"))
	require.NoError(t, err)
	_, err = a.Relocate(ctx, roam.ActorRef("y"), "node-b")
	require.NoError(t, err)
	deleted, err = a.DeleteActor(ctx, roam.ActorRef("y"))
	require.NoError(t, err)
	require.True(t, deleted)
	_, err = a.SpawnActor(ctx, "counter", "y")
	require.NoError(t, err, "spawned again where the old incarnation forwards")
	n, err = tick(ctx, b, roam.ActorRef("y"))
	require.NoError(t, err, "the new incarnation serves")
	require.EqualValues(t, 1, n)
}

// A delete whose record write fails after the incarnation has closed
// goes on until the store takes it: the record never stays behind with
// nothing serving it. A spawn whose write is indeterminate starts its
// Actor when the write landed and leaves nothing when it did not.
// Reference: docs/PROTOCOL.md §7.10.
func TestActorDeleteAndSpawnSurviveStoreFaults(t *testing.T) {
	ctx := context.Background()
	f, err := faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	a := start(t, f, roam.WithNodeName("node-a"))

	// Refused twice, then taken: the caller waits and hears true.
	_, err = a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	f.InjectOn("apply", faulty.Unavailable, faulty.Unavailable)
	deleted, err := a.DeleteActor(ctx, roam.ActorRef("x"))
	require.NoError(t, err)
	require.True(t, deleted)
	_, err = f.Read(ctx, roam.ActorRef("x"))
	require.ErrorIs(t, err, location.ErrNotFound)

	// A spawn whose write landed but was reported indeterminate serves,
	// also when the read that finds out fails at first.
	f.InjectOn("apply", faulty.IndeterminateApplied)
	_, err = a.SpawnActor(ctx, "counter", "z")
	require.NoError(t, err)
	n, err := tick(ctx, a, roam.ActorRef("z"))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	f.InjectOn("apply", faulty.IndeterminateApplied)
	f.InjectOn("read", faulty.Unavailable, faulty.Unavailable)
	_, err = a.SpawnActor(ctx, "counter", "z2")
	require.NoError(t, err)
	n, err = tick(ctx, a, roam.ActorRef("z2"))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	// One whose write was lost fails, and leaves no record.
	f.InjectOn("apply", faulty.IndeterminateLost)
	_, err = a.SpawnActor(ctx, "counter", "w")
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	_, err = f.Read(ctx, roam.ActorRef("w"))
	require.ErrorIs(t, err, location.ErrNotFound)

	// Refused past the caller's deadline (last: faults it leaves queued
	// touch nothing else): whatever the caller heard, the record ends up
	// gone, or still served if the delete ended before the close.
	_, err = a.SpawnActor(ctx, "counter", "y")
	require.NoError(t, err)
	f.InjectOn("apply", faulty.Unavailable, faulty.Unavailable, faulty.Unavailable, faulty.Unavailable, faulty.Unavailable, faulty.Unavailable)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = a.DeleteActor(short, roam.ActorRef("y"))
	t.Logf("delete past its deadline: %v", err)
	testwait.For(t, func() bool {
		if _, err := f.Read(ctx, roam.ActorRef("y")); errors.Is(err, location.ErrNotFound) {
			return true
		}
		_, err := tick(ctx, a, roam.ActorRef("y"))
		return err == nil
	}, "the record of a deleted Actor stayed with nothing serving it")
}

// gate holds a "block" turn of a gated Actor until it opens.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	done    atomic.Int64 // "block" turns finished
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 16), release: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// gated is a counter whose "block" turn waits for its gate.
type gated struct {
	counter
	gate *gate
}

func (a *gated) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.StringValue); ok && m.GetValue() == "block" {
		a.gate.entered <- struct{}{}
		<-a.gate.release
		a.gate.done.Add(1)
		return
	}
	a.counter.Receive(c)
}

func gatedKind(g *gate) roam.Kind {
	return roam.NewKind("gated", actor.PropsFromProducer(func() actor.Actor { return &gated{gate: g} }), roam.PreserveState())
}

// blockInTurn makes the Actor id start a turn that runs until g opens.
func blockInTurn(t *testing.T, r *roam.Roam, g *gate, id string) {
	t.Helper()
	pid, err := r.Resolve(context.Background(), roam.ActorRef(id))
	require.NoError(t, err)
	r.System().Root.Send(pid, wrapperspb.String("block"))
	select {
	case <-g.entered:
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the block turn did not start")
	}
}

// A delete waits for the turns its Actor accepted; a caller who gives up
// meanwhile hears DeadlineExceeded, and so does a second delete (from
// another node) of the same Actor: the record stays while the old
// incarnation still runs a turn, so the ID cannot be spawned again beside
// it, and it goes once that turn ends. Reference: docs/PROTOCOL.md §7.10.
func TestActorDeleteWaitsForItsAcceptedTurns(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	g := newGate()
	defer g.open()
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(gatedKind(g)))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(gatedKind(g)))
	_, err := a.SpawnActor(ctx, "gated", "x")
	require.NoError(t, err)
	blockInTurn(t, a, g, "x")

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = a.DeleteActor(short, roam.ActorRef("x"))
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	short2, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	_, err = b.DeleteActor(short2, roam.ActorRef("x"))
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded, "a second delete waits for the first")
	_, err = store.Read(ctx, roam.ActorRef("x"))
	require.NoError(t, err, "the record stays while the incarnation runs a turn")
	require.Zero(t, g.done.Load())
	_, err = a.SpawnActor(ctx, "gated", "x")
	require.ErrorIs(t, err, roamerr.ErrAlreadyExists)

	g.open()
	testwait.For(t, func() bool {
		_, err := store.Read(ctx, roam.ActorRef("x"))
		return errors.Is(err, location.ErrNotFound)
	}, "the record of a deleted Actor stayed")
	require.EqualValues(t, 1, g.done.Load())
	deleted, err := b.DeleteActor(ctx, roam.ActorRef("x"))
	require.NoError(t, err)
	require.False(t, deleted, "already gone")
	_, err = a.SpawnActor(ctx, "gated", "x")
	require.NoError(t, err)
	n, err := tick(ctx, b, roam.ActorRef("x"))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// refuseDeletes fails, unapplied, the store writes that delete the record
// of key while refusing is above zero, counting it down.
type refuseDeletes struct {
	location.Store
	key      location.AuthorityKey
	refusing atomic.Int32
}

func (s *refuseDeletes) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if op.Kind == location.OpDelete && op.Key == s.key && s.refusing.Add(-1) >= 0 {
			return nil, location.ErrUnavailable
		}
	}
	return s.Store.Apply(ctx, ops)
}

// A node stopped while one of its Actors is being deleted (its record's
// delete refused so far) finishes the delete before its lease ends: the
// record does not stay behind as an ended owner's object.
func TestStopFinishesAnActorDeletion(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New()
	store := &refuseDeletes{Store: inner, key: roam.ActorRef("x")}
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithRoots(inner))
	_, err := a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	store.refusing.Store(4)
	short, cancel := context.WithCancel(ctx)
	go func() {
		// The caller gives up once the first delete was refused.
		testwait.For(t, func() bool { return store.refusing.Load() < 4 }, "the record's delete was never tried")
		cancel()
	}()
	_, err = a.DeleteActor(short, roam.ActorRef("x"))
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.NoError(t, a.Stop(ctx))
	_, err = store.Read(ctx, roam.ActorRef("x"))
	require.ErrorIs(t, err, location.ErrNotFound, "the record stayed behind the stopped node")
}

// slowStopper is a counter whose Stopping handler waits for its gate (an
// application that flushes something when it stops, say).
type slowStopper struct {
	counter
	gate *gate
}

func (a *slowStopper) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Stopping); ok {
		select {
		case a.gate.entered <- struct{}{}:
		default:
		}
		<-a.gate.release
		return
	}
	a.counter.Receive(c)
}

// An Actor whose Stopping handler takes longer than Proto.Actor's stop
// future (10 s) is still deleted once it stops: the deletion waits for
// the actor's end itself.
func TestDeleteOfASlowStoppingActor(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	g := newGate()
	defer g.open()
	kind := roam.NewKind("slowstop", actor.PropsFromProducer(func() actor.Actor { return &slowStopper{gate: g} }), roam.PreserveState())
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(kind))
	_, err := a.SpawnActor(ctx, "slowstop", "x")
	require.NoError(t, err)
	type res struct {
		ok  bool
		err error
	}
	deleted := make(chan res, 1)
	go func() {
		ok, err := a.DeleteActor(ctx, roam.ActorRef("x"))
		deleted <- res{ok, err}
	}()
	testwait.Recv(t, g.entered, "the actor entered its stop")
	// The deletion waits for the actor's end, however long its stop takes
	// (not Proto.Actor's stop future, which gives up after 10 s).
	select {
	case r := <-deleted:
		t.Fatalf("the deletion returned (%v, %v) while the actor was still stopping", r.ok, r.err)
	default:
	}
	g.open()
	r := testwait.Recv(t, deleted, "the deletion returned")
	require.NoError(t, r.err)
	require.True(t, r.ok)
	_, err = store.Read(ctx, roam.ActorRef("x"))
	require.ErrorIs(t, err, location.ErrNotFound)
}

// A drain waits for a SpotWide Spot whose member is being deleted (its
// accepted turn still runs past the drain's retries of a refused move)
// instead of reporting it failed, and moves it once the deletion ended.
func TestDrainWaitsForAMemberDeletion(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	g := newGate()
	defer g.open()
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(gatedKind(g), teamKind))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(gatedKind(g), teamKind))
	crew := spotOnNode(t, "crew", "team", a, b)
	for _, id := range []string{"m1", "m2"} {
		_, err := a.Spots().SpawnMember(ctx, crew, "gated", id)
		require.NoError(t, err)
	}
	blockInTurn(t, a, g, "m1")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := a.DeleteActor(short, roam.ActorRef("m1"))
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded, "m1's deletion waits for its turn")
	// The scenario: m1's turn ends after the drain would have spent its
	// retries of a move refused as Unavailable (about 2.5 s).
	time.AfterFunc(6*time.Second, g.open)
	res, err := a.Drain(ctx, roam.DrainOptions{})
	require.NoError(t, err)
	require.True(t, res.Complete(), "the drain left the SpotWide Spot behind: %+v", res.Failed)
	require.Equal(t, b.NodeRid(), ownerOf(t, store, roam.UserSpotRef("crew")))
	_, err = store.Read(ctx, roam.ActorRef("m1"))
	require.ErrorIs(t, err, location.ErrNotFound)
}

// lateStore answers the next Apply that creates the record of key
// indeterminate at once, and applies it only after the spawn has read
// the record back (and found nothing): a write delayed on its way.
type lateStore struct {
	location.Store
	key     location.AuthorityKey
	armed   atomic.Bool
	delayed chan []location.Op
	landed  chan error
}

func (s *lateStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if op.Kind == location.OpCreate && op.Key == s.key && s.armed.CompareAndSwap(true, false) {
			s.delayed <- ops
			return nil, location.ErrIndeterminate
		}
	}
	return s.Store.Apply(ctx, ops)
}

func (s *lateStore) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	v, err := s.Store.Read(ctx, key)
	if key == s.key && errors.Is(err, location.ErrNotFound) {
		select {
		case ops := <-s.delayed:
			_, aerr := s.Store.Apply(context.Background(), ops)
			s.landed <- aerr
		default:
		}
	}
	return v, err
}

// A spawn whose write was indeterminate and not found when read back
// fails; should the write land after that read, its record (which nothing
// serves) is deleted again, and the member count stays exact.
func TestASpawnWriteLandingLateIsRemoved(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New()
	store := &lateStore{Store: inner, key: roam.ActorRef("late"), delayed: make(chan []location.Op, 1), landed: make(chan error, 1)}
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithRoots(inner))
	club, err := a.Spots().GetOrCreate(ctx, "club", "counter")
	require.NoError(t, err)
	store.armed.Store(true)
	_, err = a.Spots().SpawnMember(ctx, club.Ref, "counter", "late")
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.NoError(t, <-store.landed, "the delayed write landed")
	testwait.For(t, func() bool {
		_, err := inner.Read(ctx, roam.ActorRef("late"))
		return errors.Is(err, location.ErrNotFound)
	}, "the record of a spawn given up stayed with nothing serving it")
	require.Zero(t, memberCount(t, inner, "club"))
	_, err = a.SpawnActor(ctx, "counter", "late")
	require.NoError(t, err, "the ID is free")
}

// generationOf is the ObjectGeneration on the record of the Actor id.
func generationOf(t *testing.T, store location.Store, id string) uint64 {
	t.Helper()
	v, err := store.Read(context.Background(), location.Key(location.KindActor, id))
	require.NoError(t, err)
	return v.Record.GetObjectGeneration()
}

// A member whose owner ended is released by the operator together with
// its place in its User Spot's count, so the Spot can close.
func TestReleasedMemberLeavesTheCount(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	// Only b hosts the Spot's kind, so the Spot is b's and its member a's.
	house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
	// The member's kind waits for an operator after its owner ended (one
	// that recovers by itself has no loss to accept).
	ledger := roam.NewKind("ledger", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState(), roam.RecoverByOperator())
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithDrainOnStop(false), roam.WithKinds(ledger))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(house, ledger)) // with counter, start's kind
	club, err := a.Spots().GetOrCreate(ctx, "club", "clubhouse")
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), club.Ref.NodeRid)
	_, err = a.Spots().SpawnMember(ctx, club.Ref, "ledger", "x")
	require.NoError(t, err)
	require.EqualValues(t, 1, memberCount(t, store, "club"))
	require.NoError(t, a.Stop(ctx))
	released, err := testwait.Past(t, roamerr.ErrOwnerEnding, func() (bool, error) {
		return b.ReleaseEnded(ctx, roam.ActorRef("x"))
	})
	require.NoError(t, err)
	require.True(t, released)
	require.EqualValues(t, 0, memberCount(t, store, "club"))
	closed, err := b.Spots().Close(ctx, club.Ref)
	require.NoError(t, err)
	require.True(t, closed)
}

// A User Spot moves as one unit with its state, its members staying where
// they are (PerActor): they still belong to it, and it still counts them;
// a drain moves User Spots too. Reference: docs/PROTOCOL.md §2.1.
func TestUserSpotMovesWithoutItsMembers(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
		a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(house))
		b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(house))
		club, err := a.Spots().GetOrCreate(ctx, "club", "clubhouse")
		require.NoError(t, err)
		if club.Ref.NodeRid != a.NodeRid() {
			_, err = b.Relocate(ctx, roam.UserSpotRef("club"), "node-a")
			require.NoError(t, err)
		}
		visit := func(via *roam.Roam) int64 {
			res, err := via.Spots().Request(ctx, "club", wrapperspb.String("visit"))
			require.NoError(t, err)
			return res.(*wrapperspb.Int64Value).GetValue()
		}
		require.EqualValues(t, 1, visit(b))
		_, err = a.Spots().SpawnMember(ctx, club.Ref, "counter", "m1")
		require.NoError(t, err)

		out, err := b.Relocate(ctx, roam.UserSpotRef("club"), "node-b")
		require.NoError(t, err)
		require.Equal(t, b.NodeRid(), out.To)
		require.EqualValues(t, 2, visit(a), "the Spot's state moved with it")
		require.Equal(t, a.NodeRid(), unitOwners(t, store)[roam.ActorRef("m1")], "the member stayed")
		require.EqualValues(t, 1, memberCount(t, store, "club"))
		closed, err := a.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.False(t, closed, "its member keeps it")

		// A drain of b moves the Spot back; then the member leaves and the
		// Spot closes where it is.
		res, err := b.Drain(ctx, roam.DrainOptions{})
		require.NoError(t, err)
		require.True(t, res.Complete(), "%v", res.Failed)
		require.EqualValues(t, 3, visit(a))
		require.NoError(t, b.LeaveSpot(ctx, roam.ActorRef("m1")))
		closed, err = b.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.True(t, closed)
	})
}

// heldState captures a counter's state only once released: its move stays
// sealed until then.
type heldState struct{ sealed, release chan struct{} }

func (h heldState) Capture(a actor.Actor) ([]byte, error) {
	close(h.sealed)
	<-h.release
	return counterState(a)
}

func (h heldState) Restore(a actor.Actor, b []byte) error { return a.(*counter).RestoreState(b) }

func counterState(a actor.Actor) ([]byte, error) { return a.(*counter).CaptureState() }

// Close answers Unavailable while its Spot is sealed for a move, and
// changes nothing; the move then completes. Reference: docs/PROTOCOL.md
// §7.9.
func TestCloseOfAMovingUserSpotIsUnavailable(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	held := heldState{sealed: make(chan struct{}), release: make(chan struct{})}
	house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveStateWith(held))
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithKinds(house))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(house))
	club, err := a.Spots().GetOrCreate(ctx, "club", "clubhouse")
	require.NoError(t, err)
	other := map[string]string{a.NodeRid(): "node-b", b.NodeRid(): "node-a"}[club.Ref.NodeRid]
	moved := make(chan error, 1)
	go func() {
		_, err := a.Relocate(ctx, roam.UserSpotRef("club"), other)
		moved <- err
	}()
	testwait.For(t, func() bool {
		select {
		case <-held.sealed:
			return true
		default:
			return false
		}
	}, "the move never sealed the Spot")
	_, err = a.Spots().Close(ctx, club.Ref)
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "a Spot sealed for a move does not close")
	close(held.release)
	testwait.For(t, func() bool {
		select {
		case err := <-moved:
			require.NoError(t, err)
			return true
		default:
			return false
		}
	}, "the move did not complete")
	closed, err := b.Spots().Close(ctx, club.Ref)
	require.NoError(t, err)
	require.True(t, closed, "once moved, it closes")
}
