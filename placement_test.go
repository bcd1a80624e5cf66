package roam_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// placementLog records the director's attempts.
type placementLog struct {
	mu       sync.Mutex
	outcomes map[roam.PlacementOutcome]int
	busyKeys map[string]int
	moved    map[string]int
}

func (p *placementLog) on(a roam.PlacementAttempt, o roam.PlacementOutcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outcomes[o]++
	switch o {
	case "busy":
		p.busyKeys[a.Key]++
	case "committed":
		p.moved[a.Key]++
	}
}

func (p *placementLog) snapshot() (map[roam.PlacementOutcome]int, map[string]int, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cp := func(m map[string]int) map[string]int {
		out := map[string]int{}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	o := map[roam.PlacementOutcome]int{}
	for k, v := range p.outcomes {
		o[k] = v
	}
	return o, cp(p.busyKeys), cp(p.moved)
}

// actorsPerNode counts the Actors' records by owner node RID.
func actorsPerNode(t *testing.T, store location.Store) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, rid := range unitOwners(t, store) {
		out[rid]++
	}
	return out
}

// With the director on, 30 Actors spawned on one node of three are spread
// until no node owns more than the mean plus the margin, each by an
// idle-only move with its state; one Actor kept busy (a long turn with
// messages queued) is tried and found busy, and never moved while busy.
// On memstore and Consul.
// Reference: docs/PLACEMENT.md §2–§5 (director, idle admission, ledger,
// balance by count).
func TestDirectorSpreadsIdleActorsAndLeavesABusyOneAlone(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		log := &placementLog{outcomes: map[roam.PlacementOutcome]int{}, busyKeys: map[string]int{}, moved: map[string]int{}}
		g := &sitGate{entered: make(chan struct{}), release: make(chan struct{})}
		defer g.open()
		kind := roam.NewKind("sitter", actor.PropsFromProducer(func() actor.Actor { return &sitter{g: g} }), roam.PreserveState())
		cfg := roam.PlacementConfig{Period: 50 * time.Millisecond, OnAttempt: log.on,
			Limits: roam.PlacementLimits{Rate: 200, Burst: 20, Concurrency: 4, Cooldown: 200 * time.Millisecond}}
		a := start(t, store, roam.WithNodeName("a"), roam.WithKinds(kind), roam.WithPlacement(cfg))
		b := start(t, store, roam.WithNodeName("b"), roam.WithKinds(kind), roam.WithPlacement(cfg))
		c := start(t, store, roam.WithNodeName("c"), roam.WithKinds(kind), roam.WithPlacement(cfg))
		_, _ = b, c

		busyPID, err := a.SpawnActor(ctx, "sitter", "busy")
		require.NoError(t, err)
		a.System().Root.Send(busyPID, wrapperspb.String("hold"))
		testwait.Recv(t, g.entered, "the busy actor entered its turn")
		a.System().Root.Send(busyPID, wrapperspb.Int64(1)) // queued behind the turn
		for i := range 29 {
			pid, err := a.SpawnActor(ctx, "sitter", fmt.Sprintf("idle-%d", i))
			require.NoError(t, err)
			for range i % 5 {
				a.System().Root.Send(pid, wrapperspb.Int64(1))
			}
		}

		testwait.For(t, func() bool {
			n := actorsPerNode(t, store)
			return len(n) == 3 && n[a.NodeRid()] <= 11
		}, "the director spreads the Actors")
		testwait.For(t, func() bool {
			_, busy, _ := log.snapshot()
			return busy[location.Key(location.KindActor, "busy").String()] > 0
		},
			"the busy Actor is tried and found busy")
		_, _, moved := log.snapshot()
		require.Zero(t, moved[location.Key(location.KindActor, "busy").String()], "a busy Actor is never moved")
		pid, err := a.Resolve(ctx, roam.ActorRef("busy"))
		require.NoError(t, err)
		require.Equal(t, a.System().Address(), pid.Address)

		for i := range 29 {
			ref := roam.ActorRef(fmt.Sprintf("idle-%d", i))
			pid, err := a.Resolve(ctx, ref)
			require.NoError(t, err)
			res, err := a.System().Root.RequestFuture(pid, wrapperspb.String("get"), 10*time.Second).Result()
			require.NoError(t, err)
			require.EqualValues(t, i%5, res.(*wrapperspb.Int64Value).GetValue(), "%s kept its state", ref.ID)
		}
		outcomes, _, _ := log.snapshot()
		require.Positive(t, outcomes["committed"])
		t.Logf("attempts by outcome: %v; Actors per node: %v", outcomes, actorsPerNode(t, store))
	})
}

// The director is the oldest live lifecycle: when its node stops, the
// next oldest takes over, and balances onto a node that joins later.
// Reference: docs/PLACEMENT.md §2 (election through the store's node
// listing; a stopped director's work is taken over).
func TestDirectorFailover(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	log := &placementLog{outcomes: map[roam.PlacementOutcome]int{}, busyKeys: map[string]int{}, moved: map[string]int{}}
	kind := roam.NewKind("sitter", actor.PropsFromProducer(func() actor.Actor { return &sitter{g: &sitGate{}} }), roam.PreserveState())
	cfg := roam.PlacementConfig{Period: 50 * time.Millisecond, OnAttempt: log.on,
		Limits: roam.PlacementLimits{Rate: 200, Burst: 20, Concurrency: 4, Cooldown: 200 * time.Millisecond}}
	first := start(t, store, roam.WithNodeName("first"), roam.WithKinds(kind), roam.WithPlacement(cfg))
	b := start(t, store, roam.WithNodeName("b"), roam.WithKinds(kind), roam.WithPlacement(cfg))
	for i := range 20 {
		_, err := b.SpawnActor(ctx, "sitter", fmt.Sprintf("f-%d", i))
		require.NoError(t, err)
	}
	testwait.For(t, func() bool { n := actorsPerNode(t, store); return n[first.NodeRid()] >= 9 }, "the first director balances onto its own node")
	require.NoError(t, first.Stop(ctx)) // drains its Actors to b
	testwait.For(t, func() bool { return actorsPerNode(t, store)[b.NodeRid()] == 20 }, "the stopped node's Actors drained to b")
	c := start(t, store, roam.WithNodeName("c"), roam.WithKinds(kind), roam.WithPlacement(cfg))
	testwait.For(t, func() bool { return actorsPerNode(t, store)[c.NodeRid()] >= 9 }, "b, now the director, balances onto c")
}
