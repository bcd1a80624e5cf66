package testwait

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/machine"
)

// leakRecorder is a test whose clean-ups run when the test says and whose
// errors are recorded.
type leakRecorder struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (r *leakRecorder) Helper()          {}
func (r *leakRecorder) Failed() bool     { return len(r.errs) > 0 }
func (r *leakRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *leakRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *leakRecorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// A pooled worker (machine.Go) that was idle when a test started and
// still runs the test's work at its end is the test's leak; an idle one
// is not.
func TestNoLeaksSeesAWorkLeftOnAPooledWorkerAndNotAnIdleOne(t *testing.T) {
	defer func(p time.Duration) { LeakPatience = p }(LeakPatience)
	LeakPatience = 200 * time.Millisecond
	idleWorkers := func() int {
		n := 0
		for _, stack := range goroutines() {
			if idleWorker(stack) {
				n++
			}
		}
		return n
	}
	machine.Go(func() {})
	Within(t, 10*time.Second, func() bool { return idleWorkers() > 0 }, "a pooled worker idle")

	clean := &leakRecorder{TB: t}
	NoLeaks(clean)
	done := make(chan struct{})
	machine.Go(func() { close(done) })
	<-done
	Within(t, 10*time.Second, func() bool { return idleWorkers() > 0 }, "the worker idle again")
	clean.end()
	if len(clean.errs) > 0 {
		t.Fatalf("an idle pooled worker was taken for a leak: %s", clean.errs[0])
	}

	leaky := &leakRecorder{TB: t}
	NoLeaks(leaky)
	never := make(chan struct{})
	defer close(never)
	machine.Go(func() { <-never })
	leaky.end()
	if len(leaky.errs) == 0 || !strings.Contains(leaky.errs[0], "TestNoLeaksSeesAWorkLeftOnAPooledWorker") {
		t.Fatalf("a work left blocked on a pooled worker was not reported: %q", leaky.errs)
	}
}
