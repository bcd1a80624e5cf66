package testwait

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// NoLeaks makes t fail, once everything else it cleans up has run, if a
// goroutine started during t is still running after LeakPatience: a node
// that does not end what it started on Stop keeps working for the next
// test, which then waits on it or races it (make test on a busy machine saw
// goroutines of earlier tests still alive while a later one was stuck).
// Call it at the start of a test or from the helper that starts its first
// node, before anything whose clean-up ends goroutines is registered
// (clean-ups registered earlier run after the check); later calls in the
// same test do nothing.
func NoLeaks(t testing.TB) {
	t.Helper()
	if _, dup := leakChecked.LoadOrStore(t, true); dup {
		return
	}
	before := goroutineIDs()
	t.Cleanup(func() {
		defer leakChecked.Delete(t)
		if t.Failed() {
			return // the failure says more than what it left running
		}
		var left []string
		deadline := time.Now().Add(LeakPatience)
		for {
			left = left[:0]
			for id, stack := range goroutines() {
				if !before[id] && !ignoredGoroutine(stack) {
					left = append(left, stack)
				}
			}
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("%d goroutines started by the test still run %v after it ended:\n%s", len(left), LeakPatience, strings.Join(left, "\n\n"))
	})
}

// LeakPatience is how long a test's goroutines may take to end after its
// cleanups: stopping a node ends its connections and actors at once, but a
// busy machine schedules their last steps late.
var LeakPatience = 20 * time.Second

var leakChecked sync.Map // testing.TB → true

// ignoredGoroutine: goroutines that a process keeps once a library
// started them, whichever test did first.
func ignoredGoroutine(stack string) bool {
	if idleWorker(stack) {
		return true
	}
	for _, s := range []string{
		"testing.(*T).Run", "testing.tRunner", "testing.(*M).", "os/signal.",
		"google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run",
		"net/http.(*persistConn).", // idle keep-alive connections of a shared HTTP client
		"created by go.opentelemetry.io/otel",
		// Proto.Actor's endpoint writer dials a stopped peer again for its
		// retry count, sleeping 2 s between tries, and neither its remote's
		// Shutdown nor the actor system's interrupts it; gRPC's connection
		// attempts under it end with it.
		"remote.(*endpointWriter).initialize",
		"google.golang.org/grpc.(*addrConn).resetTransport",
		// Proto.Actor's cluster: its log throttles run for the process,
		// and the in-memory test provider's TTL reports outlive Shutdown.
		"NewThrottle", "clusterproviders/test.(*Provider).startTtlReport",
	} {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// idleWorker: a goroutine of machine.Go's pool waiting for work (it ends
// on its own after a second idle): blocked in the pool's select. One
// running work shows the work's frames above the pool's; one just given
// work is runnable, no longer blocked.
func idleWorker(stack string) bool {
	lines := strings.Split(stack, "\n")
	if !strings.Contains(lines[0], " [select") {
		return false
	}
	for _, line := range lines[1:] {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "runtime.") {
			continue
		}
		return strings.HasPrefix(line, "github.com/roamactors/roam/internal/machine.(*worker).loop(")
	}
	return false
}

// goroutineIDs are the goroutines running now, but idle pool workers: a
// worker idle at the start may take the test's work, and that work must
// count as the test's.
func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for id, stack := range goroutines() {
		if !idleWorker(stack) {
			ids[id] = true
		}
	}
	return ids
}

// goroutines are the running goroutines' stacks by ID.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		var id string
		if _, err := fmt.Sscanf(string(g), "goroutine %s", &id); err != nil {
			continue
		}
		out[id] = string(g)
	}
	return out
}
