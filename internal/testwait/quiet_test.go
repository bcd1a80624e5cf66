package testwait

import (
	"strings"
	"testing"
	"time"
)

// Quiet returns once nothing is under way.
func TestQuietReturnsOnceNothingIsUnderWay(t *testing.T) {
	left := 3
	Quiet(t, time.Minute, func() string {
		if left == 0 {
			return ""
		}
		left--
		return "some work"
	}, "the work")
	if left != 0 {
		t.Fatalf("Quiet returned with %d looks left at work under way", left)
	}
}

// Work that never ends fails the wait once its bound is spent, naming
// what it waited for, the bound and what was still under way.
func TestQuietFailsNamingWhatWasStillUnderWay(t *testing.T) {
	f := &fatalRecorder{TB: t}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		Quiet(f, 20*time.Millisecond, func() string { return "node 1 rejoins" }, "the nodes settled")
	}()
	Recv(t, ended, "Quiet to give up")
	for _, want := range []string{"the nodes settled", "20ms", "node 1 rejoins"} {
		if !strings.Contains(f.msg, want) {
			t.Fatalf("Quiet failed with %q, which should name %q", f.msg, want)
		}
	}
}
