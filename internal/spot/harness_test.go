package spot_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// consul is one real Consul server (built by tools/consul) for the
// package's tests; docs/PROTOCOL.md §3.6 says how the store uses it.
var consul *consultest.Server

func TestMain(m *testing.M) {
	consultest.Main(m, func(s *consultest.Server) { consul = s })
}

var prefixes atomic.Int64

// stores are the two Location Stores every Spot contract test runs on.
var stores = []struct {
	name string
	new  func(t testing.TB) location.Store
}{
	{"memstore", func(testing.TB) location.Store { return memstore.New() }},
	{"consul", func(t testing.TB) location.Store {
		s, err := consulstore.New(consulstore.Config{Address: consul.Addr, Prefix: fmt.Sprintf("roam-spot-test/%d", prefixes.Add(1))})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

// onBothStores runs body once per store.
func onBothStores(t *testing.T, body func(t *testing.T, store location.Store)) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			onlyOnChosenStore(t, s.name)
			body(t, s.new(t))
		})
	}
}

// onlyOnChosenStore skips a variant on the store ROAM_TEST_STORE does not
// name (memstore or consul; unset: both run). make test runs the Consul
// variants in a part of their own beside the rest: they wait on Consul's
// sessions in real time, most of this package's time.
func onlyOnChosenStore(t *testing.T, name string) {
	if chosen := os.Getenv("ROAM_TEST_STORE"); chosen != "" && chosen != name {
		t.Skipf("ROAM_TEST_STORE=%s", chosen)
	}
}

// skipWithoutAConsulVariant skips, when ROAM_TEST_STORE=consul, a test
// that starts a node outside a "consul" store variant: it has no Consul
// variant, and the memstore run make test runs beside this one runs it
// already; running it again here only repeats it.
func skipWithoutAConsulVariant(t testing.TB) {
	t.Helper()
	if os.Getenv("ROAM_TEST_STORE") != "consul" || slices.Contains(strings.Split(t.Name(), "/")[1:], "consul") {
		return
	}
	t.Skip("no Consul variant: it runs with ROAM_TEST_STORE=memstore")
}

// onBothStoresInLogicalTime runs body once per store, as onBothStores,
// for a test that waits for owner leases to be fenced, ended or revoked:
// on the memstore the world runs in logical time (its nodes and the store
// on one machine.Manual, which the test advances), so a lease ends when
// the test says and not after the seconds a busy machine takes; on Consul,
// whose sessions only end on real time, the world stays on real time, for
// what only Consul can show.
func onBothStoresInLogicalTime(t *testing.T, body func(t *testing.T, w *world)) {
	t.Run("memstore", func(t *testing.T) {
		onlyOnChosenStore(t, "memstore")
		body(t, newLogicalWorld(t))
	})
	t.Run("consul", func(t *testing.T) {
		onlyOnChosenStore(t, "consul")
		body(t, newWorld(t, stores[1].new(t)))
	})
}

// newLogicalWorld is a world on a memstore in logical time: the store's
// leases and every node started in it run on one machine.Manual, started
// at the real time so deadlines callers take from the real clock stay
// comparable with the nodes'.
func newLogicalWorld(t testing.TB) *world {
	clock := machine.NewManualAt(time.Now())
	return newLogicalWorldOn(t, clock, memstore.New(memstore.WithClock(clock)))
}

// newLogicalWorldOn is a world whose nodes run on clock, on store (whose
// leases may be measured on a clock of their own).
func newLogicalWorldOn(t testing.TB, clock *machine.Manual, store location.Store) *world {
	w := newWorld(t, store)
	w.clock = clock
	return w
}

// request is request run while the world's time passes: in logical time
// a call may wait for what only the clock ends (its deadline, an owner's
// lease, a retry's pause).
func (w *world) request(t *testing.T, e *extension.Extension, id, value string, intent ...string) (int64, error) {
	t.Helper()
	return await(t, w, "a call to "+id, func() result[int64] { return resultOf(request(t, e, id, value, intent...)) }).get()
}

// stop stops e (Extension.Stop) while the world's time passes: a
// stopping node waits on its clock for Message Follow to fall quiet.
func (w *world) stop(t testing.TB, e *extension.Extension) error {
	t.Helper()
	return await(t, w, "the node stopped", func() error { return e.Stop(context.Background()) })
}

// result is a call's two answers, to come back from await as one.
type result[T any] struct {
	v   T
	err error
}

func resultOf[T any](v T, err error) result[T] { return result[T]{v, err} }

func (r result[T]) get() (T, error) { return r.v, r.err }

// received says whether ch has delivered or is closed, without waiting.
func received[T any](ch <-chan T) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

func testLogger() *zerolog.Logger { return testlog.Logger() }

// world is a set of nodes on one store, with what their Spots did.
type world struct {
	t     testing.TB
	store location.Store
	nodes []*extension.Extension

	factories sync.Map // stable type → *atomic.Int64 (producer runs)
	mu        sync.Mutex
	handled   map[string][]string  // Spot ID → message values, in handling order
	firstOps  map[string]string    // incarnation PID id → operation of its first handled message
	firstBad  []string             // first messages that were not the winning activation's
	headers   map[string][2]string // cart message value → (operation, follow hops) as handled
	trace     []handling           // every cart message handled, in one global order
	fences    []string             // the nodes' lease status changes, for diagnosis

	// clock is the logical clock of a world in logical time
	// (newLogicalWorld), nil on real time.
	clock *machine.Manual
	// nodeStores are the stores nodes[i] was started on, and cut the
	// faulty ones partitioned away (partition): a node cut off from its
	// store settles only when its renewal times out, so the steps of the
	// clock do not wait for it.
	nodeStores []location.Store
	cut        map[*faulty.Store]bool
}

// logicalStep is how far the logical clock moves between two looks at a
// condition: a twentieth of the nodes' lease TTL, short against their
// renewal period (TTL/3), as real time is: a node's renewal is sent and
// answered before the next is due.
const logicalStep = testLeaseTTL / 20

// logicalPatience is how much logical time a condition may take: every
// wait here is for a lease to be fenced, ended or revoked and then acted
// on, a few TTLs; one not met by then is not coming.
const logicalPatience = 12 * testLeaseTTL

// testLeaseTTL is the nodes' owner lease TTL. 5 s: a node fences itself
// when no renewal proves its lease for TTL minus the margin, and on real
// time a loaded 2-core machine under -race can delay a renewal by seconds.
const testLeaseTTL = 5 * time.Second

// now is the world's time: the logical clock's, or the real one.
func (w *world) now() time.Time {
	if w.clock != nil {
		return w.clock.Now()
	}
	return time.Now()
}

// partition cuts f, the store of some of the world's nodes, off (on) or
// heals it.
func (w *world) partition(f *faulty.Store, on bool) {
	w.mu.Lock()
	if w.cut == nil {
		w.cut = map[*faulty.Store]bool{}
	}
	w.cut[f] = on
	w.mu.Unlock()
	f.Partition(on)
}

// unsettled names a node that reaches its store and still has work under
// way that only needs the CPU (extension.Extension.Settled): Ticks the
// logical clock fired or renewal answers its lease loop has yet to take,
// or a rejoin, from its lease's end until the next lifecycle is current.
// "" when there is none. A stopped node's lease has ended, and no rejoin
// follows, which settles it.
func (w *world) unsettled() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, e := range w.nodes {
		if f, ok := w.nodeStores[i].(*faulty.Store); ok && w.cut[f] {
			continue
		}
		if e.Settled() {
			continue
		}
		if e.Node().LeaseStatus() == lease.Ended {
			return fmt.Sprintf("node %d (%s) rejoins: its lease ended and the next lifecycle is not current yet", i, e.NodeRid())
		}
		return fmt.Sprintf("node %d (%s): its lease loop has Ticks or renewal answers to take", i, e.NodeRid())
	}
	return ""
}

// settleBound is how long, in real time, the nodes may take to settle
// after a step of the logical clock: a rejoin (a new actor system and
// remote, the claim) under the race detector on a loaded 2-core machine
// takes seconds. A node not settled by then is stuck on something other
// than the clock.
const settleBound = 30 * time.Second

// advance moves the world's logical clock d forward in logicalSteps,
// letting every node that reaches its store settle before and after each:
// the clock moves only when what is left for the nodes is to wait on it,
// however slowly their goroutines get the CPU. Before, too: what the test
// did since the last step (a partition healed, a node started) may have
// set work going.
func (w *world) advance(t testing.TB, d time.Duration) {
	t.Helper()
	for d > 0 {
		testwait.Quiet(t, settleBound, w.unsettled, "the nodes settled before a step of the logical clock")
		s := min(d, logicalStep)
		w.clock.Advance(s)
		d -= s
		testwait.Quiet(t, settleBound, w.unsettled, "the nodes settled after a step of the logical clock")
	}
}

// eventually waits until cond holds. In logical time it looks at cond
// after each logicalStep of the clock, for at most logicalPatience of it
// (and the test's real patience); on real time it polls (eventually).
func (w *world) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	w.eventuallyWithin(t, logicalPatience, what, cond)
}

// eventuallyWithin is eventually for a condition that may take up to
// patience of logical time.
func (w *world) eventuallyWithin(t testing.TB, patience time.Duration, what string, cond func() bool) {
	t.Helper()
	if w.clock == nil {
		testwait.For(t, cond, what)
		return
	}
	start, realStart := w.clock.Now(), time.Now()
	realPatience := testwait.Patience(t)
	for !cond() {
		if passed, took := w.clock.Now().Sub(start), time.Since(realStart); passed >= patience || took > realPatience {
			t.Fatalf("timed out waiting for %s: %v of logical time passed (bound %v), %v of real time (bound %v)",
				what, passed, patience, took.Round(time.Millisecond), realPatience)
		}
		w.advance(t, logicalStep)
	}
}

// past is testwait.Past in the world's time: it retries do while its
// error matches transient and returns its first other answer, advancing a
// logical clock a step between attempts.
func past[T any](t testing.TB, w *world, transient error, do func() (T, error)) (T, error) {
	t.Helper()
	if w.clock == nil {
		return testwait.Past(t, transient, do)
	}
	var v T
	var err error
	w.eventually(t, fmt.Sprintf("an answer other than %v", transient), func() bool {
		v, err = do()
		return !errors.Is(err, transient)
	})
	return v, err
}

// await waits for the result of an operation that ends once its work is
// done or the world's time passes (a node's lease ends, a deadline on its
// clock, a wait for Message Follow to fall quiet): it runs do on its own
// goroutine and, in logical time, moves the clock awaitStep whenever do
// has not returned within awaitGrace of real time. The grace lets the work do
// started run before the clock moves again: moved at once, the clock
// would run past do's timers while its messages and store writes are
// still on their way, which no real clock does.
func await[T any](t testing.TB, w *world, what string, do func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- do() }()
	realPatience := testwait.Patience(t)
	if w.clock == nil {
		select {
		case v := <-done:
			return v
		case <-time.After(realPatience):
			t.Fatalf("timed out waiting for %s (bound %v of real time)", what, realPatience)
		}
	}
	start, realStart := w.clock.Now(), time.Now()
	for {
		select {
		case v := <-done:
			return v
		case <-time.After(awaitGrace):
		}
		if passed, took := w.clock.Now().Sub(start), time.Since(realStart); passed >= logicalPatience || took > realPatience {
			t.Fatalf("timed out waiting for %s: %v of logical time passed (bound %v), %v of real time (bound %v)",
				what, passed, logicalPatience, took.Round(time.Millisecond), realPatience)
		}
		w.advance(t, logicalStep)
	}
}

// awaitGrace is how long await lets an operation work in real time
// before it moves the logical clock awaitStep, in logicalSteps the nodes
// settle after: what an operation waits for on the clock (a restore's
// retries, a drain's timeouts) takes tens of seconds of it.
const (
	awaitGrace = 20 * time.Millisecond
	awaitStep  = logicalStep
)

// handling is one handled cart message: which incarnation (node address
// and PID id) handled which value.
type handling struct {
	incarnation string
	value       string
	at          time.Time // the world's time (world.now)
}

func newWorld(t testing.TB, store location.Store) *world {
	return &world{t: t, store: store, handled: map[string][]string{}, firstOps: map[string]string{}, headers: map[string][2]string{}}
}

func (w *world) count(stableType string) *atomic.Int64 {
	c, _ := w.factories.LoadOrStore(stableType, &atomic.Int64{})
	return c.(*atomic.Int64)
}

// nodeOpt adjusts one node's configuration.
type nodeOpt func(*extension.Config)

func inMesh(mesh string) nodeOpt { return func(c *extension.Config) { c.Node.Mesh = mesh } }

func withKinds(kinds ...extension.Kind) nodeOpt {
	return func(c *extension.Config) { c.Kinds = kinds }
}

func withStore(s location.Store) nodeOpt { return func(c *extension.Config) { c.Node.Store = s } }

// start starts a node hosting the room (User Spot) and cart (Instance
// Spot) kinds unless opts say otherwise.
func (w *world) start(opts ...nodeOpt) *extension.Extension {
	w.t.Helper()
	skipWithoutAConsulVariant(w.t)
	testwait.NoLeaks(w.t)
	cfg := extension.Config{
		Node:  meshnode.Config{Store: w.store, Logger: testlog.For(w.t), LeaseTTL: testLeaseTTL},
		Kinds: []extension.Kind{w.roomKind(), w.cartKind("cart")},
	}
	if w.clock != nil {
		cfg.Node.Clock = w.clock
	}
	for _, o := range opts {
		o(&cfg)
	}
	e, err := extension.Start(context.Background(), cfg)
	require.NoError(w.t, err)
	rid := e.NodeRid()
	e.Node().OnLeaseChange(func(s lease.Status) {
		w.mu.Lock()
		w.fences = append(w.fences, fmt.Sprintf("%s %s at %s", rid, s, w.now().Format("15:04:05.000")))
		w.mu.Unlock()
	})
	w.t.Cleanup(func() {
		if w.clock == nil {
			_ = e.Stop(context.Background())
			return
		}
		if w.t.Failed() {
			// A node stuck in what failed the test would hold the clock's
			// steps again here, for another settleBound: end it at once.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.StopNow(ctx)
			return
		}
		_ = w.stop(w.t, e)
	})
	w.mu.Lock()
	w.nodes = append(w.nodes, e)
	w.nodeStores = append(w.nodeStores, cfg.Node.Store)
	w.mu.Unlock()
	return e
}

func (w *world) startN(n int, opts ...nodeOpt) {
	for i := 0; i < n; i++ {
		w.start(opts...)
	}
}

// room is a User Spot: it counts messages and echoes its creation request.
type room struct {
	w     *world
	count int64
}

func (r *room) OnCreate(req proto.Message) (proto.Message, error) {
	if s, ok := req.(*wrapperspb.StringValue); ok {
		if s.Value == "reject" {
			return wrapperspb.String("declined"), spot.ErrRejected
		}
		return wrapperspb.String("created:" + s.Value), nil
	}
	return nil, nil
}

func (r *room) Receive(c actor.Context) {
	if s, ok := c.Message().(*wrapperspb.StringValue); ok {
		r.count++
		r.w.record(spotIDOf(c.Self()), s.Value)
		c.Respond(wrapperspb.Int64(r.count))
	}
}

type countState struct{}

func (countState) Capture(a actor.Actor) ([]byte, error) {
	switch a := a.(type) {
	case *room:
		return []byte(fmt.Sprint(a.count)), nil
	case *cart:
		return []byte(fmt.Sprint(a.count)), nil
	}
	return nil, fmt.Errorf("unknown actor %T", a)
}

func (countState) Restore(a actor.Actor, b []byte) error {
	var n int64
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return err
	}
	switch a := a.(type) {
	case *room:
		a.count = n
	case *cart:
		a.count = n
	}
	return nil
}

func (w *world) roomKind() extension.Kind {
	return extension.Kind{StableType: "room", Policy: extension.PreserveStateWith(countState{}),
		Producer: func() actor.Actor { w.count("room").Add(1); return &room{w: w} }}
}

// cart is an Instance Spot: it records every message with its operation,
// and checks on its first message that this is the message whose
// activation created the incarnation (PROTOCOL.md §7.5, §12.2 item 15).
type cart struct {
	w      *world
	count  int64
	seen   bool
	stable string
}

func (k *cart) Receive(c actor.Context) {
	s, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	id := spotIDOf(c.Self())
	if !k.seen {
		k.seen = true
		op := ""
		if h := c.MessageHeader(); h != nil {
			op = h.Get(relocation.HeaderOperation)
		}
		v, err := k.w.store.Read(context.Background(), location.Key(location.KindInstanceSpot, id))
		k.w.mu.Lock()
		k.w.firstOps[c.Self().Id] = op
		if err != nil || v.Record.GetActivationRecovery().GetOperationId() != op {
			k.w.firstBad = append(k.w.firstBad, fmt.Sprintf("%s first handled %q (op %s), the record's activation is %v (err %v)",
				c.Self().Id, s.Value, op, v.Record.GetActivationRecovery(), err))
		}
		k.w.mu.Unlock()
	}
	k.count++
	k.w.record(id, s.Value)
	k.w.mu.Lock()
	k.w.trace = append(k.w.trace, handling{incarnation: c.Self().GetAddress() + "/" + c.Self().GetId(), value: s.Value, at: k.w.now()})
	k.w.mu.Unlock()
	if h := c.MessageHeader(); h != nil {
		k.w.mu.Lock()
		k.w.headers[s.Value] = [2]string{h.Get(relocation.HeaderOperation), h.Get(relocation.HeaderHops)}
		k.w.mu.Unlock()
	}
	if s.Value == "close" {
		if err := spot.CloseSelf(c); err != nil {
			k.w.t.Errorf("CloseSelf: %v", err)
		}
	}
	c.Respond(wrapperspb.Int64(k.count))
}

func (w *world) cartKind(stableType string) extension.Kind {
	return extension.Kind{StableType: stableType, Instance: true, Policy: extension.PreserveStateWith(countState{}), ReactivateEmpty: true,
		Producer: func() actor.Actor { w.count(stableType).Add(1); return &cart{w: w, stable: stableType} }}
}

func (w *world) record(id, value string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handled[id] = append(w.handled[id], value)
}

func (w *world) handledOf(id string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.handled[id]...)
}

// spotIDOf reads the Spot ID out of an incarnation's PID id
// ("roam/<kind>/<id>@<generation>.<owner generation>").
func spotIDOf(pid *actor.PID) string {
	id := pid.Id
	id = id[strings.Index(id[len("roam/"):], "/")+len("roam/")+1:]
	return id[:strings.LastIndex(id, "@")]
}

// eventually waits for cond, polling, up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testwait.Patience(t))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ownerOf finds which of a and b owns the Spot id now, and the other one.
func ownerOf(t *testing.T, id string, a, b *extension.Extension) (ref spot.SpotRef, owner, other *extension.Extension) {
	t.Helper()
	ref, err := a.Spots().Find(context.Background(), id)
	require.NoError(t, err)
	if ref.NodeRid == b.NodeRid() {
		return ref, b, a
	}
	require.Equal(t, a.NodeRid(), ref.NodeRid)
	return ref, a, b
}
