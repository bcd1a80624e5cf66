package machine

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitFor polls ok until it holds or patience passes (testwait imports
// this package, so it cannot be used here).
func waitFor(t *testing.T, patience time.Duration, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", patience, what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (p *workerPool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// Work given while every worker is busy runs at once on a new one (Go is
// the go statement: it never waits for a worker); once they are done,
// the pool keeps at most maxIdleWorkers of them, the most recently idle
// one runs the next work, and an idle worker ends after workerIdle.
func TestThePoolRunsEverythingAtOnceReusesItsWorkersAndEndsIdleOnes(t *testing.T) {
	p := &workerPool{}
	const busy = maxIdleWorkers + 44
	release := make(chan struct{})
	var started, ended sync.WaitGroup
	started.Add(busy)
	ended.Add(busy)
	for range busy {
		p.run(func() {
			started.Done()
			<-release
			ended.Done()
		})
	}
	// Each blocks until all have started: none waited for another.
	waitGroup(t, &started, "every work to start while the others block")
	close(release)
	waitGroup(t, &ended, "every work to end")
	waitFor(t, 10*time.Second, func() bool { return p.idleCount() == maxIdleWorkers }, "the idle workers to park")

	// The next work runs on the worker that went idle last.
	p.mu.Lock()
	last := p.idle[len(p.idle)-1]
	p.mu.Unlock()
	ids := make(chan string, 2)
	p.run(func() { ids <- goroutineID() })
	first := <-ids
	waitFor(t, 10*time.Second, func() bool { return p.idleCount() == maxIdleWorkers }, "the worker to park again")
	p.mu.Lock()
	again := p.idle[len(p.idle)-1]
	p.mu.Unlock()
	if again != last {
		t.Fatalf("the work ran on another worker than the last idle one")
	}
	p.run(func() { ids <- goroutineID() })
	if second := <-ids; second != first {
		t.Fatalf("two works in a row ran on goroutines %s and %s: the pool did not reuse its worker", first, second)
	}

	waitFor(t, 10*workerIdle, func() bool { return p.idleCount() == 0 }, "the idle workers to end")
	// An ended worker is gone; new work starts another.
	done := make(chan struct{})
	p.run(func() { close(done) })
	<-done
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10s for %s", what)
	}
}
