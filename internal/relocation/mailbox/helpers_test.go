package mailbox

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
)

// Tests wait on progress, never on a fixed time (a loaded 2-core machine
// under -race can be many times slower than usual): a wait fails when
// nothing has progressed for stallTimeout, or when the test's own deadline
// (go test -timeout) is near. Nothing sleeps to synchronise.
const stallTimeout = time.Minute

// patience is how long a wait without a progress measure may take: up to
// the test's deadline less a margin to report the failure.
func patience(t testing.TB) time.Duration { return testwait.Patience(t) }

// quietLogger keeps Proto.Actor's supervision logs (expected in the panic
// tests) out of the test output.
func quietLogger() actor.ConfigOption {
	return actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	})
}

// newSystem starts one local actor system for a test (no remote).
func newSystem(t testing.TB) *actor.ActorSystem {
	t.Helper()
	system := actor.NewActorSystem(quietLogger())
	t.Cleanup(system.Shutdown)
	return system
}

// spawn starts an actor with this package's mailbox and returns its PID and
// mailbox (captured through Producer's created callback, which runs
// synchronously inside Spawn). The actor is stopped at cleanup.
func spawn(t testing.TB, system *actor.ActorSystem, recv actor.ReceiveFunc, opts ...Option) (*actor.PID, *Mailbox) {
	t.Helper()
	var mb *Mailbox
	props := actor.PropsFromFunc(recv, actor.WithMailbox(Producer(func(m *Mailbox) { mb = m }, opts...)))
	pid := system.Root.Spawn(props)
	require.NotNil(t, mb, "Producer's created callback must run inside Spawn")
	t.Cleanup(func() { system.Root.Stop(pid) })
	return pid, mb
}

// recorder is a mutex-protected log of what an actor received, with a
// notification when a predicate becomes true.
type recorder struct {
	mu    sync.Mutex
	items []any
	waits []recWait
}

type recWait struct {
	pred func([]any) bool
	ch   chan struct{}
}

func (r *recorder) add(v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
	kept := r.waits[:0]
	for _, w := range r.waits {
		if w.pred(r.items) {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	r.waits = kept
}

func (r *recorder) snapshot() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.items...)
}

// when returns a channel closed once pred holds for the recorded items.
func (r *recorder) when(pred func([]any) bool) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	if pred(r.items) {
		close(ch)
		return ch
	}
	r.waits = append(r.waits, recWait{pred: pred, ch: ch})
	return ch
}

// waitFor waits until pred holds, failing when recording stalls.
func (r *recorder) waitFor(t testing.TB, what string, pred func([]any) bool) []any {
	t.Helper()
	done := r.when(pred)
	deadline := time.Now().Add(patience(t))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	seen, progressed := len(r.snapshot()), time.Now()
	for {
		select {
		case <-done:
			return r.snapshot()
		case now := <-tick.C:
			if n := len(r.snapshot()); n != seen {
				seen, progressed = n, now
			}
			if now.Sub(progressed) > stallTimeout || now.After(deadline) {
				t.Fatalf("no progress waiting for %s; recorded %d items: %v", what, len(r.snapshot()), tail(r.snapshot(), 20))
			}
		}
	}
}

func tail(xs []any, n int) []any {
	if len(xs) > n {
		return xs[len(xs)-n:]
	}
	return xs
}

// countOf returns a predicate: at least n items satisfy keep.
func countOf(n int, keep func(any) bool) func([]any) bool {
	return func(items []any) bool {
		c := 0
		for _, it := range items {
			if keep(it) {
				c++
			}
		}
		return c >= n
	}
}

// only filters items with keep.
func only(items []any, keep func(any) bool) []any {
	var out []any
	for _, it := range items {
		if keep(it) {
			out = append(out, it)
		}
	}
	return out
}

// recv waits for one value from ch, failing near the test's deadline.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience(t)):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// waitWG waits for wg, failing near the test's deadline (a lost wake-up
// never finishes).
func waitWG(t testing.TB, wg *sync.WaitGroup, what string) {
	d := patience(t)
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("timed out waiting for %s (lost wake-up?)", what)
	}
}

// doSync runs fn through m.Do and waits for it to have run.
func doSync(t testing.TB, m *Mailbox, fn func()) {
	t.Helper()
	ran := make(chan struct{})
	require.NoError(t, m.Do(func() {
		fn()
		close(ran)
	}))
	recv(t, ran, "Do item to run")
}

// gate is a message whose handling blocks mid-turn until released.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}), release: make(chan struct{})}
}

// hold blocks the calling turn: signals entered, waits for release.
func (g *gate) hold() {
	close(g.entered)
	<-g.release
}

// num is a numbered user message from poster p.
type num struct{ p, i int }

func isNum(v any) bool { _, ok := v.(num); return ok }

func isInt(v any) bool { _, ok := v.(int); return ok }

// ints converts []any of ints.
func ints(items []any) []int {
	out := make([]int, 0, len(items))
	for _, it := range items {
		out = append(out, it.(int))
	}
	return out
}

func seq(from, to int) []int { // [from, to)
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func anys(xs []int) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// requirePerPosterOrder checks that, for each poster, the num messages appear
// exactly as 0..perPoster-1 in order: nothing lost, duplicated or reordered.
func requirePerPosterOrder(t testing.TB, items []any, posters, perPoster int) {
	t.Helper()
	next := make([]int, posters)
	for _, it := range items {
		n, ok := it.(num)
		if !ok {
			continue
		}
		require.Equalf(t, next[n.p], n.i, "poster %d: expected message %d, got %d", n.p, next[n.p], n.i)
		next[n.p]++
	}
	for p := range posters {
		require.Equalf(t, perPoster, next[p], "poster %d: message count", p)
	}
}
