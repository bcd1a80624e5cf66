// Package testwait gives tests one rule for how long to wait: on progress,
// never a fixed time. make test must pass on a busy 2-core machine under
// the race detector, where a wait that takes 2 s when idle can take 30 s, so
// a wait for a condition is bounded only by the test's own deadline
// (go test -timeout), less a margin to report what did not happen.
package testwait

import (
	"errors"
	"testing"
	"time"
)

// Patience is how long a test may still wait for a condition.
func Patience(t testing.TB) time.Duration {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			return max(time.Until(dl)-15*time.Second, time.Second)
		}
	}
	return 5 * time.Minute
}

// For waits until cond holds, checking every 10 ms, and fails t with msg
// once its Patience is spent.
func For(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(Patience(t))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Past retries do while its error matches transient (errors.Is) and
// returns its first other answer, failing t once its Patience is spent.
// For a condition that ends by itself, such as an ended owner that other
// nodes take over only a lease TTL after they first see it gone.
func Past[T any](t testing.TB, transient error, do func() (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(Patience(t))
	for {
		v, err := do()
		if !errors.Is(err, transient) {
			return v, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
