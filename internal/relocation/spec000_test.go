package relocation_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/roamerr"
)

// logBuffer collects log lines for assertions on their event names
// (docs/PROTOCOL.md names them).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) has(event string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.b.Bytes(), []byte(`"event":"`+event+`"`))
}

// hasLine reports whether one log line has the event and contains every
// other fragment.
func (l *logBuffer) hasLine(event string, fragments ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, line := range bytes.Split(l.b.Bytes(), []byte("\n")) {
		if !bytes.Contains(line, []byte(`"event":"`+event+`"`)) {
			continue
		}
		for _, f := range fragments {
			if !bytes.Contains(line, []byte(f)) {
				continue next
			}
		}
		return true
	}
	return false
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines are the log lines with the event.
func (l *logBuffer) lines(event string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range bytes.Split(l.b.Bytes(), []byte("\n")) {
		if bytes.Contains(line, []byte(`"event":"`+event+`"`)) {
			out = append(out, string(line))
		}
	}
	return out
}

func (l *logBuffer) logger() *zerolog.Logger {
	lg := zerolog.New(l)
	return &lg
}

// writeRecorder wraps a node's view of the store and records the keys it
// writes.
type writeRecorder struct {
	location.Store
	mu     sync.Mutex
	writes []location.AuthorityKey
}

func (w *writeRecorder) CompareAndSet(ctx context.Context, key location.AuthorityKey, v location.StoreVersion, r *location.Record) (location.StoreVersion, error) {
	w.mu.Lock()
	w.writes = append(w.writes, key)
	w.mu.Unlock()
	return w.Store.CompareAndSet(ctx, key, v, r)
}

func (w *writeRecorder) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	w.mu.Lock()
	for _, op := range ops {
		w.writes = append(w.writes, op.Key)
	}
	w.mu.Unlock()
	return w.Store.Apply(ctx, ops)
}

func (w *writeRecorder) wrote(key location.AuthorityKey) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, k := range w.writes {
		if k == key {
			n++
		}
	}
	return n
}

// gate is a counter whose turn can be held open, to queue work behind it.
type gate struct {
	counter
	hold chan struct{}
}

func (g *gate) Receive(c actor.Context) {
	if s, ok := c.Message().(*wrapperspb.StringValue); ok && s.Value == "hold" {
		<-g.hold
		return
	}
	g.counter.Receive(c)
}

type gateState struct{}

func (gateState) Capture(a actor.Actor) ([]byte, error) {
	return counterState{}.Capture(&a.(*gate).counter)
}
func (gateState) Restore(a actor.Actor, b []byte) error {
	return counterState{}.Restore(&a.(*gate).counter, b)
}

// Work queued before the seal (saved work) runs on the target before the
// messages that arrived while sealed (the relay), each exactly once. The
// move is held at its target's Restore request while the second hundred
// is sent, so those can only travel in the boundary batch, and the test
// checks they did.
// Reference: docs/PROTOCOL.md §5.5, §5.12, §12.1 items 4 and 22 (saved work
// before relay; not relayed again).
func TestSavedWorkRunsBeforeRelayExactlyOnce(t *testing.T) {
	hold := make(chan struct{})
	kind := relocation.Kind{StableType: "gate", Producer: func() actor.Actor { return &gate{hold: hold} }, Policy: relocation.PreserveStateWith(gateState{})}
	store := newStore(t)
	a, b := startNodeWith(t, store, kind), startNodeWith(t, store, kind)
	sealed := holdAtPrepare(t, b)
	batch := watchBatch(t, b)
	ctx := context.Background()
	key := location.Key(location.KindActor, "g1")
	pid, err := a.driver.Spawn(ctx, "gate", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	root.Send(pid, wrapperspb.String("hold")) // the turn in progress
	for i := int64(1); i <= 100; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // queued behind the turn
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	// The seal is asked for while the turn runs, so it lands right after
	// it, ahead of the queued hundred: they become saved work.
	testwait.For(t, func() bool { return relocation.Leaving(a.driver, key) }, "the move never began to seal")
	close(hold)
	sealed.wait(t)
	for i := int64(101); i <= 200; i++ {
		root.Send(pid, wrapperspb.Int64(i)) // sealed: the ingress hold
	}
	sealed.release()
	require.NoError(t, <-moved)
	require.Equal(t, int64(200), get(t, root.ActorSystem(), pid), "each handled once, in order (negative: out of order)")
	require.Equal(t, 100, batch.records(), "the sends posted while sealed travel in the boundary batch")
}

// A target that fails the Restore replies an explicit failure; the source
// puts its saved work back in original order and keeps serving, and the
// store still names it.
// Reference: PROTOCOL.md §6.2, §12.1 item 25.
func TestExplicitFailureRestoresTheSource(t *testing.T) {
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	failing := counterKind
	failing.Policy = relocation.PreserveStateWith(failingRestore{})
	b := startNodeWith(t, store, failing)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", "f1")
	require.NoError(t, err)
	root := a.node.System().Root
	for i := int64(1); i <= 500; i++ {
		root.Send(pid, wrapperspb.Int64(i))
	}
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "f1"), b.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	for i := int64(501); i <= 600; i++ {
		root.Send(pid, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(600), get(t, root.ActorSystem(), pid), "all handled once, in order, on the source")
	v, err := store.Read(ctx, location.Key(location.KindActor, "f1"))
	require.NoError(t, err)
	require.Equal(t, a.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid())
	require.EqualValues(t, 1, v.Record.GetAuthorityOwnerGeneration())
	ok, err := a.driver.Serving(ctx, location.Key(location.KindActor, "f1"))
	require.NoError(t, err)
	require.True(t, ok)
}

type failingRestore struct{ counterState }

func (failingRestore) Restore(actor.Actor, []byte) error { return errors.New("restore refused") }

// A target that does not host the kind refuses before any seal: the move
// fails Unavailable and the object never stopped serving.
// Reference: PROTOCOL.md §5.2, §6.1 (first row).
func TestCapabilityRefusalNeverSeals(t *testing.T) {
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	b := startNodeWith(t, store) // no kinds
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", "r1")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "r1"), b.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))
}

// The source never writes the owner record; only the target does, once.
// Reference: PROTOCOL.md §5.11, §12.1 item 17 (the source does not change
// the owner).
func TestOnlyTheTargetWritesTheOwner(t *testing.T) {
	shared := newStore(t)
	srcView, dstView := &writeRecorder{Store: shared}, &writeRecorder{Store: shared}
	a := startNodeWith(t, srcView, counterKind)
	b := startNodeWith(t, dstView, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "w1")
	_, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	before := srcView.wrote(key)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, before, srcView.wrote(key), "the source wrote the owner record")
	require.Equal(t, 1, dstView.wrote(key))
}

// Indeterminate and unavailable answers to the target's CAS are retried
// with the same fence and RelocationId; a write that did land is found by
// the re-read and the move converges.
// Reference: PROTOCOL.md §5.11, §3.3, §12.1 item 19.
func TestCASRetriesConvergeOnIndeterminateOutcomes(t *testing.T) {
	shared := newStore(t)
	f, err := faulty.New(shared, faulty.Config{})
	require.NoError(t, err)
	a := startNodeWith(t, shared, counterKind)
	b := startNodeWith(t, f, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "i1")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	// The target's first read fails, its CAS lands but the answer is lost.
	f.InjectOn("read", faulty.Unavailable)
	f.InjectOn("apply", faulty.IndeterminateApplied)
	out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	v, err := shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, out.RelocationID, v.Record.GetRelocationId())
	require.EqualValues(t, 2, v.Record.GetAuthorityOwnerGeneration())
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))
}

// When the store stays unavailable past the restore deadline, the target
// logs location_update_failed and removes what it prepared; it never opens.
// The source, past the cutover, fences the move out once the target's
// deadline is over and serves again with the state it kept: exactly one
// node serves, never two, never none for good.
// Reference: PROTOCOL.md §5.11, §6.3, §6.5, §12.1 item 26; docs/FAULTS.md
// (a target lost after relay-ready).
func TestLocationUpdateFailedRemovesTheTarget(t *testing.T) {
	shared := newStore(t)
	f, err := faulty.New(shared, faulty.Config{})
	require.NoError(t, err)
	logs := &logBuffer{}
	events := make(chan relocation.Event, 1)
	cfg := relocation.Config{RestoreTimeout: 2 * time.Second, Logger: logs.logger(), OnEvent: func(e relocation.Event) { events <- e }}
	a := startNodeConfig(t, shared, relocation.Config{RestoreTimeout: 2 * time.Second}, counterKind)
	b := startNodeConfig(t, f, cfg, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "d1")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	for i := int64(1); i <= 5; i++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(i))
	}
	// From now on the target cannot write the store: it admits the move
	// (its reads work) and its owner CAS never lands.
	for i := 0; i < 10000; i++ {
		f.InjectOn("apply", faulty.Unavailable)
	}
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	e := <-events
	require.ErrorIs(t, e.Err, roamerr.ErrDeadlineExceeded)
	require.True(t, logs.has("location_update_failed"))
	waitServing(t, a, key, true, "the source never served again")
	ok, err := b.driver.Serving(ctx, key)
	require.NoError(t, err)
	require.False(t, ok, "the target never opened")
	v, err := shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, a.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid(), "the store still names the source")
	require.Equal(t, int64(5), get(t, a.node.System(), pid), "the source kept its state")
}

// A payload larger than the in-flight budget still moves, chunk by chunk,
// and a multi-chunk move ends exactly like a single-chunk one.
// Reference: PROTOCOL.md §5.3, §5.6, §12.1 items 6 and 12 (a payload over
// the budget completes).
func TestPayloadLargerThanBudgetMoves(t *testing.T) {
	store := newStore(t)
	kind := relocation.Kind{StableType: "blob", Producer: func() actor.Actor { return &blob{} }, Policy: relocation.PreserveStateWith(blobState{size: 1 << 20})}
	events := make(chan relocation.Event, 4)
	cfg := relocation.Config{InFlightPayloadBudget: 64 << 10, OnEvent: func(e relocation.Event) { events <- e }}
	a, b := startNodeConfig(t, store, cfg, kind), startNodeConfig(t, store, cfg, kind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "big")
	pid, err := a.driver.Spawn(ctx, "blob", key.ID)
	require.NoError(t, err)
	out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Greater(t, out.Chunks, uint32(4))
	e := <-events
	require.NoError(t, e.Err)
	res, err := a.node.System().Root.RequestFuture(pid, wrapperspb.String("len"), 10*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), res.(*wrapperspb.Int64Value).Value)
}

// staleOnFirstRead makes another owner appear just before the target's
// first read of key, as a concurrent move elsewhere would.
type staleOnFirstRead struct {
	location.Store
	key  location.AuthorityKey
	once sync.Once
}

func (s *staleOnFirstRead) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key == s.key {
		s.once.Do(func() {
			v, err := s.Store.Read(ctx, key)
			if err == nil {
				r := v.Record
				r.Owner.NodeRid = "some-other-node"
				r.AuthorityOwnerGeneration++
				_, _ = s.Store.CompareAndSet(ctx, key, v.Version, r)
			}
		})
	}
	return s.Store.Read(ctx, key)
}

// When the store names another valid owner, the target ends the move as
// stale at once, without waiting for the deadline, and removes what it
// prepared; nothing dispatches on the target.
// Reference: PROTOCOL.md §5.11 (another valid owner or generation: stale).
func TestAnotherOwnerMakesTheMoveStale(t *testing.T) {
	for _, checkFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("source check before the seal %v", checkFirst), func(t *testing.T) {
			shared := newStore(t)
			key := location.Key(location.KindActor, "s1")
			logs := &logBuffer{}
			events := make(chan relocation.Event, 1)
			a := startNodeWith(t, shared, counterKind)
			b := startNodeConfig(t, &staleOnFirstRead{Store: shared, key: key}, relocation.Config{Logger: logs.logger(), OnEvent: func(e relocation.Event) { events <- e }}, counterKind)
			if !checkFirst {
				relocation.WithoutSourceCheck(b.driver)
			}
			ctx := context.Background()
			pid, err := a.driver.Spawn(ctx, "counter", key.ID)
			require.NoError(t, err)
			_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
			require.ErrorIs(t, err, roamerr.ErrStale)
			if checkFirst {
				// Refused before the seal: no Restore request, no target run.
				require.Zero(t, relocation.PrecheckedRestores(b.driver))
			} else {
				e := testwait.Recv(t, events, "the target's report of the move")
				require.ErrorIs(t, e.Err, roamerr.ErrStale, "ended as stale, not by the restore deadline")
			}
			require.True(t, logs.has("stale_relocation"))
			ok, err := b.driver.Serving(ctx, key)
			require.NoError(t, err)
			require.False(t, ok)
			a.node.System().Root.Send(pid, wrapperspb.Int64(1))
			require.Equal(t, int64(1), get(t, a.node.System(), pid), "the source serves on")
		})
	}
}

// Chunks of a large payload share the connection with other objects'
// traffic: requests to another object on the target are answered while
// the move is still transferring.
// Reference: PROTOCOL.md §5.6, §12.1 item 7 (other messages between chunks).
func TestOtherTrafficInterleavesWithChunks(t *testing.T) {
	store := newStore(t)
	big := relocation.Kind{StableType: "blob", Producer: func() actor.Actor { return &blob{} }, Policy: relocation.PreserveStateWith(blobState{size: 32 << 20})}
	// 32 MiB under -race on a busy 2-core machine can take longer than the
	// default 10 s restore deadline; the check here is the interleaving.
	cfg := relocation.Config{Logger: testLogger(), RestoreTimeout: 2 * time.Minute}
	a, b := startNodeConfig(t, store, cfg, big, counterKind), startNodeConfig(t, store, cfg, big, counterKind)
	ctx := context.Background()
	_, err := a.driver.Spawn(ctx, "blob", "huge")
	require.NoError(t, err)
	other, err := b.driver.Spawn(ctx, "counter", "other")
	require.NoError(t, err)

	moving := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		close(moving)
		_, err := a.driver.Relocate(ctx, location.Key(location.KindActor, "huge"), b.node.Descriptor().GetNodeRid())
		done <- err
	}()
	<-moving
	answeredDuring := 0
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.Positive(t, answeredDuring, "no other request crossed while the payload was in flight")
			return
		default:
		}
		if _, err := a.node.System().Root.RequestFuture(other, wrapperspb.String("get"), 10*time.Second).Result(); err == nil {
			answeredDuring++
		}
	}
}
