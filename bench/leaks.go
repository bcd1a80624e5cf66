package main

import (
	"fmt"
	"os"
	"runtime"
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
	return resources{goroutines: runtime.NumGoroutine(), fds: fds}
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
			return now, fmt.Errorf("left %d goroutines and %d descriptors more than before it (%s, then %s) after %v",
				now.goroutines-before.goroutines, now.fds-before.fds, before, now, leakPatience)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
