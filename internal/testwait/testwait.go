// Package testwait gives tests one rule for how long to wait: on progress,
// never a fixed time, and never long. make test must pass on a busy 2-core
// machine under the race detector, where a wait that takes 2 s when idle
// can take 30 s; but a condition that does not come within a minute is not
// coming, and waiting out the package's whole timeout for it would cost
// every later test of the package too. So each wait is bounded by what it
// waits for (Within: a few times that operation's own timeout) or else by
// Bound, and fails naming what it waited for and how long.
package testwait

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/roamactors/roam/location"
)

// Bound is the longest any one wait may take unless the test names a
// longer one (Within). ROAM_TEST_WAIT (a Go duration) overrides it for a
// machine slower than the 2-core CI machine under load.
var Bound = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("ROAM_TEST_WAIT")); err == nil && d > 0 {
		return d
	}
	return time.Minute
}()

// Patience is how long a test may still wait for a condition or an
// answer: Bound, less if the test's own deadline (go test -timeout) comes
// sooner, keeping a margin to report what did not happen.
func Patience(t testing.TB) time.Duration { return capped(t, Bound) }

func capped(t testing.TB, d time.Duration) time.Duration {
	if dl, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if at, ok := dl.Deadline(); ok {
			return max(min(d, time.Until(at)-15*time.Second), time.Second)
		}
	}
	return d
}

// For waits until cond holds, checking every 10 ms, and fails t with msg
// once its Patience is spent.
func For(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	Within(t, Bound, cond, msg)
}

// Within waits until cond holds for at most d (a few times the timeout of
// what it waits for), and fails t naming msg and d.
func Within(t testing.TB, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	d = capped(t, d)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for: %s", d, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Quiet waits until busy reports nothing under way (""), checking every
// 10 ms, for at most d, and fails t naming msg, d and what was still
// under way: the wait between two steps of a logical clock, for work that
// only needs the CPU.
func Quiet(t testing.TB, d time.Duration, busy func() string, msg string) {
	t.Helper()
	d = capped(t, d)
	deadline := time.Now().Add(d)
	for {
		what := busy()
		if what == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for: %s; still under way: %s", d, msg, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Past retries do while its error matches transient (errors.Is) and
// returns its first other answer, failing t once its Patience is spent.
// For a condition that ends by itself, such as an ended owner that other
// nodes take over only a lease TTL after they first see it gone. A node's
// refusal while it is fenced (location.ErrFenced: its lease renewal came
// late, as on a starved machine) ends by itself too, at its next renewal,
// and is retried whatever transient is.
func Past[T any](t testing.TB, transient error, do func() (T, error)) (T, error) {
	t.Helper()
	d := Patience(t)
	deadline := time.Now().Add(d)
	for {
		v, err := do()
		if !errors.Is(err, transient) && !errors.Is(err, location.ErrFenced) {
			return v, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after %v", err, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Recv waits for a value from ch (or its close) for at most t's Patience,
// and fails t naming msg: a bare receive whose sender is stuck would hold
// the package until go test's own timeout, and every later test with it.
func Recv[T any](t testing.TB, ch <-chan T, msg string) T {
	t.Helper()
	d := Patience(t)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for: %s", d, msg)
		panic("unreachable: Fatalf ends the test")
	}
}
