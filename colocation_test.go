package roam_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	"github.com/roamactors/roam/location/memstore"
)

// talker is an Instance Spot that counts what it gets; "ping:<id>" makes
// it send "pong" to Spot id by Spot ID, From its own context.
type talker struct {
	count, failed int64
}

func (s *talker) Receive(c actor.Context) {
	m, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	switch v := m.GetValue(); {
	case strings.HasPrefix(v, "ping:"):
		s.count++
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := roam.Get(c.ActorSystem()).Spots().Send(ctx, strings.TrimPrefix(v, "ping:"), wrapperspb.String("pong"), roam.InstanceSpot("talker"), roam.From(c)); err != nil {
			s.failed++
		}
	case v == "pong":
		s.count++
	case v == "get":
		c.Respond(wrapperspb.String(fmt.Sprintf("%d %d", s.count, s.failed)))
	}
}

func (s *talker) CaptureState() ([]byte, error) {
	return fmt.Appendf(nil, "%d %d", s.count, s.failed), nil
}

func (s *talker) RestoreState(b []byte) error {
	_, err := fmt.Sscanf(string(b), "%d %d", &s.count, &s.failed)
	return err
}

// Objects that talk to each other, placed on different nodes, are put on
// one node by the director's co-location while they keep talking: nine
// pairs (one end pings, the other answers by Spot ID) and a group of three
// spread over the three nodes. No object moves back to a node it left,
// every move is an idle move, and every message is counted exactly once
// with its state. An object may move twice: when the last member of the
// group cannot follow the first onto its node (no room left within the
// slack, or its move answered busy), the group may converge on the last
// member's node instead, the first following it there.
// On memstore and Consul.
// Reference: docs/PLACEMENT.md §5 (sampling, co-location with
// hysteresis and slack, idle moves only).
func TestDirectorCoLocatesObjectsThatTalk(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		log := &placementLog{outcomes: map[roam.PlacementOutcome]int{}, busyKeys: map[string]int{}, moved: map[string]int{}}
		trail := &moveTrail{left: map[string]map[string]bool{}}
		onAttempt := func(a roam.PlacementAttempt, o roam.PlacementOutcome) {
			log.on(a, o)
			trail.on(a, o)
		}
		kind := roam.NewKind("talker", actor.PropsFromProducer(func() actor.Actor { return &talker{} }), roam.PreserveState(), roam.Instance())
		cfg := roam.PlacementConfig{Period: 50 * time.Millisecond, OnAttempt: onAttempt, Paused: true,
			CoLocation: roam.PlacementCoLocation{Enabled: true, SampleEvery: 1, MinGain: 2},
			Limits:     roam.PlacementLimits{Rate: 200, Burst: 20, Concurrency: 4, Cooldown: 200 * time.Millisecond}}
		nodes := []*roam.Roam{
			start(t, store, roam.WithNodeName("a"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
			start(t, store, roam.WithNodeName("b"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
			start(t, store, roam.WithNodeName("c"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
		}
		a := nodes[0]
		get := func(id string) (count, failed int64) {
			reply, err := a.Spots().Request(ctx, id, wrapperspb.String("get"), roam.InstanceSpot("talker"), roam.Timeout(20*time.Second))
			require.NoError(t, err)
			_, err = fmt.Sscanf(reply.(*wrapperspb.StringValue).GetValue(), "%d %d", &count, &failed)
			require.NoError(t, err)
			return count, failed
		}
		owner := func(id string) string {
			v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, id))
			require.NoError(t, err)
			return v.Record.GetOwner().GetNodeRid()
		}
		// Activate every object, then put each pair's ends and the group's
		// members on different nodes.
		type pair struct{ from, to string }
		var pairs []pair
		for i := range 9 {
			pairs = append(pairs, pair{fmt.Sprintf("p%d-a", i), fmt.Sprintf("p%d-b", i)})
		}
		group := []string{"g-0", "g-1", "g-2"}
		pairs = append(pairs, pair{group[0], group[1]}, pair{group[1], group[2]}, pair{group[2], group[0]})
		var ids []string
		for i, p := range pairs[:9] {
			ids = append(ids, p.from, p.to)
			get(p.from)
			get(p.to)
			spread(t, nodes, owner, []string{p.from, p.to}, i)
		}
		for _, id := range group {
			get(id)
		}
		ids = append(ids, group...)
		spread(t, nodes, owner, group, 0)

		// Traffic: every pair's first end is pinged from node a, paced.
		var sent sync.Map // id → *atomic.Int64
		for _, p := range pairs {
			sent.Store(p.from, new(atomic.Int64))
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				for _, p := range pairs {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if err := a.Spots().Send(ctx, p.from, wrapperspb.String("ping:"+p.to), roam.InstanceSpot("talker")); err == nil {
						n, _ := sent.Load(p.from)
						n.(*atomic.Int64).Add(1)
					}
				}
			}
		}()
		for _, n := range nodes {
			n.Placement().Resume()
		}
		colocated := func() bool {
			for _, p := range pairs {
				if owner(p.from) != owner(p.to) {
					return false
				}
			}
			return true
		}
		testwait.For(t, colocated, "every pair and the group end on one node each")
		close(stop)
		testwait.Recv(t, done, "the senders ended")
		for _, n := range nodes {
			n.Placement().Pause()
		}

		// The store shows a move before its attempt's outcome is counted.
		testwait.For(t, func() bool { _, _, moved := log.snapshot(); return len(moved) >= 9+2 }, "one end of each pair and two of the group counted as moved")
		outcomes, _, moved := log.snapshot()
		require.Empty(t, trail.returns(), "objects moved back to a node they left (moves: %v)", moved)
		// Every ping and every pong counted once, none failed.
		pongs := map[string]int64{}
		for _, p := range pairs {
			n, _ := sent.Load(p.from)
			pongs[p.to] += n.(*atomic.Int64).Load()
		}
		for _, p := range pairs {
			n, _ := sent.Load(p.from)
			want := n.(*atomic.Int64).Load() + pongs[p.from]
			testwait.For(t, func() bool { c, _ := get(p.from); return c >= want }, "the pings reach "+p.from)
			c, failed := get(p.from)
			require.Equal(t, want, c, "%s counted each ping and pong once", p.from)
			require.Zero(t, failed, "%s: every pong was sent", p.from)
		}
		for _, id := range ids {
			c, _ := get(id)
			require.Equal(t, pongs[id]+func() int64 {
				if n, ok := sent.Load(id); ok {
					return n.(*atomic.Int64).Load()
				}
				return 0
			}(), c, "%s", id)
		}
		t.Logf("attempts by outcome: %v; objects moved: %d", outcomes, len(moved))
	})
}

// moveTrail records, from the committed attempts, the nodes each object
// left, and every move back to one of them.
type moveTrail struct {
	mu   sync.Mutex
	left map[string]map[string]bool // object → the nodes it left
	back []string
}

func (m *moveTrail) on(a roam.PlacementAttempt, o roam.PlacementOutcome) {
	if o != roam.PlacementCommitted {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.left[a.Key][a.TargetRid] {
		m.back = append(m.back, fmt.Sprintf("%s back to %s", a.Key, a.TargetRid))
	}
	if m.left[a.Key] == nil {
		m.left[a.Key] = map[string]bool{}
	}
	m.left[a.Key][a.SourceRid] = true
}

func (m *moveTrail) returns() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.back)
}

// spread moves the objects ids onto different nodes, starting at node
// first (mod the node count).
func spread(t *testing.T, nodes []*roam.Roam, owner func(string) string, ids []string, first int) {
	t.Helper()
	for i, id := range ids {
		n := nodes[(first+i)%len(nodes)]
		if owner(id) == n.NodeRid() {
			continue
		}
		_, err := nodes[0].Relocate(context.Background(), roam.InstanceSpotRef(id), n.NodeName())
		require.NoError(t, err)
	}
}

// Balance by load: three Instance Spots that get all the traffic, all on
// one node of three, are spread one per node by idle moves, with every
// message counted once; by count the nodes were balanced already (the
// other two nodes hold idle Spots).
// Reference: docs/PLACEMENT.md §5 (balance by load).
func TestDirectorBalancesByLoad(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	kind := roam.NewKind("talker", actor.PropsFromProducer(func() actor.Actor { return &talker{} }), roam.PreserveState(), roam.Instance())
	cfg := roam.PlacementConfig{Period: 50 * time.Millisecond, Paused: true, BalanceBy: "load",
		CoLocation: roam.PlacementCoLocation{SampleEvery: 1},
		Limits:     roam.PlacementLimits{Rate: 200, Burst: 20, Concurrency: 4, Cooldown: 200 * time.Millisecond}}
	nodes := []*roam.Roam{
		start(t, store, roam.WithNodeName("a"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
		start(t, store, roam.WithNodeName("b"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
		start(t, store, roam.WithNodeName("c"), roam.WithKinds(kind), roam.WithPlacement(cfg)),
	}
	a := nodes[0]
	owner := func(id string) string {
		v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, id))
		require.NoError(t, err)
		return v.Record.GetOwner().GetNodeRid()
	}
	get := func(id string) int64 {
		reply, err := a.Spots().Request(ctx, id, wrapperspb.String("get"), roam.InstanceSpot("talker"), roam.Timeout(20*time.Second))
		require.NoError(t, err)
		var count, failed int64
		_, err = fmt.Sscanf(reply.(*wrapperspb.StringValue).GetValue(), "%d %d", &count, &failed)
		require.NoError(t, err)
		return count
	}
	hot := []string{"hot-0", "hot-1", "hot-2"}
	for i, id := range append(append([]string{}, hot...), "idle-b-0", "idle-b-1", "idle-b-2", "idle-c-0", "idle-c-1", "idle-c-2") {
		get(id)
		spread(t, nodes, owner, []string{id}, i/3)
	}
	var sent [3]atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			for i, id := range hot {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if err := a.Spots().Send(ctx, id, wrapperspb.String("pong"), roam.InstanceSpot("talker")); err == nil {
					sent[i].Add(1)
				}
			}
		}
	}()
	for _, n := range nodes {
		n.Placement().Resume()
	}
	testwait.For(t, func() bool {
		return len(map[string]bool{owner(hot[0]): true, owner(hot[1]): true, owner(hot[2]): true}) == 3
	}, "one hot Spot per node")
	close(stop)
	testwait.Recv(t, done, "the senders ended")
	for _, n := range nodes {
		n.Placement().Pause()
		t.Logf("%s: %v", n.NodeName(), n.Placement().Outcomes())
	}
	for i, id := range hot {
		require.Equal(t, sent[i].Load(), get(id), "%s counted every message once", id)
	}
}
