package relocation_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// counter counts numbered sends (Int64Value) and answers a request
// (StringValue "get") with the count; it records order violations.
type counter struct {
	mu        sync.Mutex
	count     int64
	last      int64
	disorder  int
	instances *int32
}

func (c *counter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *wrapperspb.Int64Value:
		c.mu.Lock()
		if m.Value != c.last+1 {
			c.disorder++
		}
		c.last = m.Value
		c.count++
		c.mu.Unlock()
	case *wrapperspb.StringValue:
		c.mu.Lock()
		n := c.count
		if c.disorder > 0 {
			n = -int64(c.disorder)
		}
		c.mu.Unlock()
		ctx.Respond(wrapperspb.Int64(n))
	}
}

// counterState carries count, last and disorder across a move.
type counterState struct{}

func (counterState) Capture(a actor.Actor) ([]byte, error) {
	c := a.(*counter)
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b[0:], uint64(c.count))
	binary.BigEndian.PutUint64(b[8:], uint64(c.last))
	binary.BigEndian.PutUint64(b[16:], uint64(c.disorder))
	return b, nil
}

func (counterState) Restore(a actor.Actor, state []byte) error {
	if len(state) != 24 {
		return errors.New("bad counter state")
	}
	c := a.(*counter)
	c.count = int64(binary.BigEndian.Uint64(state[0:]))
	c.last = int64(binary.BigEndian.Uint64(state[8:]))
	c.disorder = int(binary.BigEndian.Uint64(state[16:]))
	return nil
}

// testLogger logs to stderr when ROAM_TEST_LOG is set (debug with =debug).
func testLogger() *zerolog.Logger { return testlog.Logger() }

type testNode struct {
	node   *meshnode.Node
	driver *relocation.Driver
}

type cluster3 struct {
	store  location.Store
	nodes  []*testNode
	mu     sync.Mutex
	events []relocation.Event
}

// newStore is the store the driver tests run on: memstore, or a real
// Consul when ROAM_TEST_STORE=consul (make test runs both).
func newStore(t testing.TB) location.Store {
	if os.Getenv("ROAM_TEST_STORE") == "consul" {
		return newConsulStore(t)
	}
	return memstore.New()
}

func newMemStoreTB() location.Store { return memstore.New() }

// checkpointsBeside: a checkpoint store per wrapped Location Store.
var checkpointsBeside sync.Map

// startNodeWith starts one node with a driver and the given kinds.
func startNodeWith(t testing.TB, store location.Store, kinds ...relocation.Kind) *testNode {
	t.Helper()
	return startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, kinds...)
}

func startNodeConfig(t testing.TB, store location.Store, cfg relocation.Config, kinds ...relocation.Kind) *testNode {
	t.Helper()
	return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger()}, cfg, kinds...)
}

// startMeshNode starts a node with nodeCfg, its driver with cfg, hosting
// kinds; both stop with the test.
func startMeshNode(t testing.TB, nodeCfg meshnode.Config, cfg relocation.Config, kinds ...relocation.Kind) *testNode {
	t.Helper()
	testwait.NoLeaks(t)
	store := nodeCfg.Store
	if _, ok := store.(location.CheckpointStore); !ok && cfg.Checkpoints == nil {
		// A test's wrapper of the store (faults on records): the nodes of
		// one store share one checkpoint store beside it.
		cs, _ := checkpointsBeside.LoadOrStore(store, memstore.New())
		cfg.Checkpoints = cs.(location.CheckpointStore)
	}
	node, err := meshnode.Start(context.Background(), nodeCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	d, err := relocation.New(node, store, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { // before the node stops: the load it keeps is the load there is
		if kept, counted, err := relocation.LoadCounted(d); err == nil && kept != counted {
			t.Errorf("load kept (serving, staging) %v, counted over the incarnations %v", kept, counted)
		}
	})
	for _, k := range kinds {
		require.NoError(t, d.RegisterKind(k))
	}
	return &testNode{node: node, driver: d}
}

var counterKind = relocation.Kind{
	StableType: "counter",
	Producer:   func() actor.Actor { return &counter{} },
	Policy:     relocation.PreserveStateWith(counterState{}),
}

func startNodes(t *testing.T, n int) *cluster3 {
	t.Helper()
	c := &cluster3{store: newStore(t)}
	for i := 0; i < n; i++ {
		c.nodes = append(c.nodes, startNodeConfig(t, c.store, relocation.Config{Logger: testLogger(), OnEvent: func(e relocation.Event) {
			c.mu.Lock()
			c.events = append(c.events, e)
			c.mu.Unlock()
		}}, counterKind))
	}
	return c
}

func (c *cluster3) rid(i int) string { return c.nodes[i].node.Descriptor().GetNodeRid() }

func get(t *testing.T, sys *actor.ActorSystem, pid *actor.PID) int64 {
	t.Helper()
	res, err := sys.Root.RequestFuture(pid, wrapperspb.String("get"), 10*time.Second).Result()
	require.NoError(t, err)
	require.NoError(t, relocation.DeliveryError(res))
	return res.(*wrapperspb.Int64Value).Value
}

// An Actor moves with its state and its queue while sends keep arriving at
// its old address: every send is handled once, in order, and the store
// names the target with the move's RelocationId. Sends arrive before the
// seal (handled on the source or saved work), while sealed (the move is
// held at its target's Restore request meanwhile, so they travel in the
// boundary batch, which the test checks is not empty) and after that
// (the batch's tail, or held until the commit shows, then Message
// Follow).
// Reference: docs/PROTOCOL.md §5.4–§5.14.
func TestActorMovesWithStateAndQueueWhileReceiving(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	sealed := holdAtPrepare(t, b)
	batch := watchBatch(t, b)
	pid, err := a.driver.Spawn(ctx, "counter", "c1")
	require.NoError(t, err)
	spawned, err := c.store.Read(ctx, location.Key(location.KindActor, "c1"))
	require.NoError(t, err)

	const total = 2000
	send := func(from, to int64) {
		for i := from; i <= to; i++ {
			a.node.System().Root.Send(pid, wrapperspb.Int64(i))
		}
	}
	early := make(chan struct{})
	go func() {
		defer close(early)
		send(1, total/2)
	}()
	type moved struct {
		out relocation.Outcome
		err error
	}
	done := make(chan moved, 1)
	go func() {
		out, err := a.driver.Relocate(ctx, location.Key(location.KindActor, "c1"), c.rid(1))
		done <- moved{out, err}
	}()
	sealed.wait(t)
	<-early
	const whileSealed = total / 4
	send(total/2+1, total/2+whileSealed)
	sealed.release()
	send(total/2+whileSealed+1, total)
	m := <-done
	out, err := m.out, m.err
	require.NoError(t, err)
	require.Equal(t, c.rid(1), out.To)
	require.NotZero(t, out.Bytes)

	v, err := c.store.Read(ctx, location.Key(location.KindActor, "c1"))
	require.NoError(t, err)
	require.Equal(t, c.rid(1), v.Record.GetOwner().GetNodeRid())
	require.Equal(t, spawned.Record.GetObjectGeneration(), v.Record.GetObjectGeneration(), "a move keeps the ObjectGeneration (PROTOCOL.md §2.3)")
	require.Equal(t, out.RelocationID, v.Record.GetRelocationId())
	require.EqualValues(t, 2, v.Record.GetAuthorityOwnerGeneration())
	require.Equal(t, b.node.EntrySpotID(), v.Record.GetMembership().GetSpotId())

	newPID, err := b.driver.Resolve(ctx, location.Key(location.KindActor, "c1"))
	require.NoError(t, err)
	require.Equal(t, b.node.Address(), newPID.Address)
	// Through the old address (Message Follow) and the new one, the count
	// is exactly the number sent, with no order violation.
	require.Equal(t, int64(total), get(t, a.node.System(), pid))
	require.Equal(t, int64(total), get(t, a.node.System(), newPID))
	require.GreaterOrEqual(t, batch.records(), whileSealed, "the sends posted while sealed travel in the boundary batch")

	// The target reports its Event once it has opened dispatch, on its
	// driver goroutine: it may come just after the first answers.
	testwait.For(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.events) > 0
	}, "the target never reported the move")
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.events, 1)
	require.NoError(t, c.events[0].Err)
	require.Equal(t, out.RelocationID, c.events[0].RelocationID)
	fmt.Printf("pause %s, source-observed %s, bytes %d\n", c.events[0].Pause, out.Pause, out.Bytes)
}

// Moves to one target share capability queries: those waiting for an
// answer wait for one query, and its spare tickets serve the moves after
// it; every move still carries a ticket of its own and completes.
// Reference: docs/PROTOCOL.md §5.2.
func TestMovesToOneTargetShareCapabilityQueries(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	var queries atomic.Int32
	relocation.DropInbound(b.driver, func(m any) bool {
		if _, ok := m.(*messages.CapabilityQuery); ok {
			queries.Add(1)
		}
		return false
	})
	const n = 40
	pids := make([]*actor.PID, n)
	for i := range pids {
		pid, err := a.driver.Spawn(ctx, "counter", fmt.Sprintf("shared-%d", i))
		require.NoError(t, err)
		a.node.System().Root.Send(pid, wrapperspb.Int64(1))
		pids[i] = pid
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.driver.Relocate(ctx, location.Key(location.KindActor, fmt.Sprintf("shared-%d", i)), c.rid(1))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, pid := range pids {
		require.Equal(t, int64(1), get(t, a.node.System(), pid), "moved with its state")
	}
	require.Less(t, int(queries.Load()), n, "every move asked on its own")
	t.Logf("%d capability queries for %d moves", queries.Load(), n)
}
