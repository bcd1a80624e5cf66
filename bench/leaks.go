package main

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"
)

// What a section may leave behind once it has ended and had leakPatience
// to wind down: a few goroutines and descriptors of the runtime and of
// connections being closed. More is a leak — goroutines or sockets of
// nodes, stores or clients that a section did not stop — which would
// slow the sections after it and make their figures depend on order.
const (
	leakGoroutines = 25
	leakFDs        = 10
	leakPatience   = 10 * time.Second
)

// resources are the process's goroutines and open file descriptors
// (sockets included).
type resources struct{ goroutines, fds int }

func (r resources) String() string {
	return fmt.Sprintf("%d goroutines, %d descriptors", r.goroutines, r.fds)
}

func snapshot() resources {
	fds := -1
	if es, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(es)
	}
	n := 0
	for _, g := range stacks() {
		if !forLife(g) {
			n++
		}
	}
	return resources{goroutines: n, fds: fds}
}

// forLife: goroutines Proto.Actor's cluster starts and never ends — its
// log throttles, and the in-memory test provider's TTL reports, which
// outlive Shutdown — six for each cluster of two members (h)'s baseline
// starts. They are not counted against a section.
func forLife(stack string) bool {
	return strings.Contains(stack, "NewThrottle") || strings.Contains(stack, "clusterproviders/test.(*Provider).startTtlReport")
}

// stacks are the stacks of the process's goroutines.
func stacks() []string {
	buf := make([]byte, 1<<24)
	return strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
}

// leftBehind waits, up to leakPatience, for the process to be back
// within the slack of before, and returns what it found last and an
// error naming the excess if it never was.
func leftBehind(before resources) (resources, error) {
	deadline := time.Now().Add(leakPatience)
	for {
		runtime.GC() // finalizers close what was dropped without Close
		now := snapshot()
		within := now.goroutines <= before.goroutines+leakGoroutines && (before.fds < 0 || now.fds <= before.fds+leakFDs)
		if within {
			return now, nil
		}
		if time.Now().After(deadline) {
			return now, fmt.Errorf("left %d goroutines and %d descriptors more than before it (%s, then %s) after %v; goroutines by creator: %s",
				now.goroutines-before.goroutines, now.fds-before.fds, before, now, leakPatience, creators())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// creators counts the process's goroutines by the function that created
// them, most first: what a leak is made of.
func creators() string {
	counts := map[string]int{}
	for _, g := range stacks() {
		if forLife(g) {
			continue
		}
		if i := strings.Index(g, "created by "); i >= 0 {
			name, _, _ := strings.Cut(g[i+len("created by "):], "\n")
			name, _, _ = strings.Cut(name, " in goroutine")
			counts[name]++
		}
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return counts[names[i]] > counts[names[j]] })
	var out []string
	for _, n := range names[:min(len(names), 5)] {
		out = append(out, fmt.Sprintf("%s ×%d", n, counts[n]))
	}
	return strings.Join(out, ", ")
}
