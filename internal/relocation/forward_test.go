package relocation_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// forwardWorld is three nodes on one logical clock: an asker, the owner of
// a counter and a move target.
type forwardWorld struct {
	clock                *machine.Manual
	asker, owner, target *testNode
	key                  location.AuthorityKey
}

func newForwardWorld(t *testing.T) *forwardWorld {
	t.Helper()
	clock := machine.NewManualAt(time.Now())
	store := memstore.New(memstore.WithClock(clock))
	start := func() *testNode {
		return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), Clock: clock, LeaseTTL: 10 * time.Second},
			relocation.Config{Logger: testLogger()}, counterKind)
	}
	w := &forwardWorld{clock: clock, asker: start(), owner: start(), target: start(), key: location.Key(location.KindActor, "forwarded")}
	_, err := w.owner.driver.Spawn(context.Background(), "counter", w.key.ID)
	require.NoError(t, err)
	return w
}

// advance moves the clock by d in steps of a second, with the nodes
// (those not stopped) settled after each.
func (w *forwardWorld) advance(t *testing.T, d time.Duration, nodes ...*testNode) {
	t.Helper()
	var settled []func() bool
	for _, n := range nodes {
		settled = append(settled, n.node.Settled)
	}
	testwait.Advance(t, w.clock, d, time.Second, settled...)
}

// dropCounted makes n's relocation actor drop every message of type T and
// counts them.
func dropCounted[T any](n *testNode) *atomic.Int64 {
	var dropped atomic.Int64
	relocation.DropInbound(n.driver, func(m any) bool {
		if _, ok := m.(T); ok {
			dropped.Add(1)
			return true
		}
		return false
	})
	return &dropped
}

type moveResult struct {
	out relocation.Outcome
	err error
}

func (w *forwardWorld) relocateAt(ctx context.Context) <-chan moveResult {
	done := make(chan moveResult, 1)
	go func() {
		out, err := w.asker.driver.RelocateAt(ctx, w.owner.node.Address(), w.key, w.target.node.Descriptor().GetNodeRid())
		done <- moveResult{out, err}
	}()
	return done
}

// A Relocate waiting for its move ends with Unavailable when its node
// stops meanwhile: the move's timers stop with the node, so nothing else
// would ever end it, and a caller without a deadline (an owner running a
// move another node asked for) would wait for good. In logical time, with
// the clock standing still, no timeout of the move can end it instead.
// Reference: docs/PROTOCOL.md §6.4 (Relocate: outcome unknown).
func TestRelocateEndsUnavailableWhenItsNodeStopsMidMove(t *testing.T) {
	w := newForwardWorld(t)
	queries := dropCounted[*messages.CapabilityQuery](w.target)
	done := make(chan moveResult, 1)
	go func() {
		out, err := w.owner.driver.Relocate(context.Background(), w.key, w.target.node.Descriptor().GetNodeRid())
		done <- moveResult{out, err}
	}()
	testwait.For(t, func() bool { return queries.Load() > 0 }, "the move's capability query at the target")
	require.NoError(t, w.owner.node.Stop(context.Background()))
	r := testwait.Recv(t, done, "Relocate to end after its node stopped")
	require.ErrorIs(t, r.err, roamerr.ErrUnavailable)
	// The stopped node's capability question ends with the node, though
	// its timeout is on a clock nobody moves any more: the leak check at
	// the test's end finds it otherwise.
}

// A forwarded move whose owner never answers (its request lost) ends with
// DeadlineExceeded once the owner's own bound for a move and a margin have
// passed on the asker's clock, not minutes later; the owner's lifecycle
// lasts, so only the time ends it.
// Reference: docs/PROTOCOL.md §7.10 (operations asked of the owner).
func TestAForwardedMoveNeverAnsweredEndsAtTheOwnersBound(t *testing.T) {
	w := newForwardWorld(t)
	requests := dropCounted[*messages.RelocateRequest](w.owner)
	done := w.relocateAt(context.Background())
	testwait.For(t, func() bool { return requests.Load() > 0 }, "the forwarded request at the owner")
	patience := relocation.ForwardedPatience(w.asker.driver)
	require.Less(t, patience, time.Minute, "a forwarded move's bound is the owner's own, not minutes")

	w.advance(t, patience-time.Second, w.asker, w.owner, w.target)
	select {
	case r := <-done:
		t.Fatalf("the forwarded move ended before its bound (%v): %v", patience, r.err)
	default:
	}
	w.advance(t, 2*time.Second, w.asker, w.owner, w.target)
	r := testwait.Recv(t, done, "the forwarded move to end once its bound passed")
	require.ErrorIs(t, r.err, roamerr.ErrDeadlineExceeded)
}

// A forwarded move ends with Unavailable as soon as the asker sees the
// owner's lifecycle end (its descriptor gone from the store), well before
// the bound: the answer of an ended lifecycle never comes.
// Reference: docs/PROTOCOL.md §7.10 (operations asked of the owner).
func TestAForwardedMoveEndsWhenTheOwnersLifecycleEnds(t *testing.T) {
	w := newForwardWorld(t)
	requests := dropCounted[*messages.RelocateRequest](w.owner)
	done := w.relocateAt(context.Background())
	testwait.For(t, func() bool { return requests.Load() > 0 }, "the forwarded request at the owner")
	require.NoError(t, w.owner.node.Stop(context.Background()))
	// Two looks at the owner's descriptor, at most a second apart.
	w.advance(t, 2*time.Second, w.asker, w.target)
	r := testwait.Recv(t, done, "the forwarded move to end once its owner's lifecycle ended")
	require.ErrorIs(t, r.err, roamerr.ErrUnavailable)
}

// A forwarded move ends with Unavailable when the asking node stops while
// it waits: its reply route goes with it.
// Reference: docs/PROTOCOL.md §7.10 (operations asked of the owner).
func TestAForwardedMoveEndsWhenTheAskersNodeStops(t *testing.T) {
	w := newForwardWorld(t)
	requests := dropCounted[*messages.RelocateRequest](w.owner)
	done := w.relocateAt(context.Background())
	testwait.For(t, func() bool { return requests.Load() > 0 }, "the forwarded request at the owner")
	require.NoError(t, w.asker.node.Stop(context.Background()))
	r := testwait.Recv(t, done, "the forwarded move to end once the asking node stopped")
	require.ErrorIs(t, r.err, roamerr.ErrUnavailable)
}
