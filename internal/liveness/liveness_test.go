package liveness

import (
	"testing"
	"time"
)

const ttl = 10 * time.Second

// A lifecycle is Alive while its descriptor's version moves, Silent once
// one version stood still for its TTL from this node's first sight of it
// (not from the first sight of the lifecycle), and a newer version makes
// it Alive again.
func TestSilentOnlyAfterAVersionStoodStillForItsTTL(t *testing.T) {
	w := New(ttl)
	steps := []struct {
		version uint64
		at      time.Duration
		want    Verdict
	}{
		{1, 0, Alive},
		{2, 9 * time.Second, Alive},
		{2, 18 * time.Second, Alive}, // 9 s after version 2 was first seen
		{2, 19 * time.Second, Silent},
		{3, 19*time.Second + time.Millisecond, Alive}, // renewed meanwhile
		{3, 28 * time.Second, Alive},
	}
	for i, s := range steps {
		if got := w.Seen("n/l", s.version, 0, s.at); got != s.want {
			t.Fatalf("step %d: version %d at %s: %s, want %s", i, s.version, s.at, got, s.want)
		}
	}
}

// The longer of the descriptor's own TTL and the watcher's counts: a
// holder with a longer lease is not taken for fenced early.
func TestTheLongerTTLCounts(t *testing.T) {
	w := New(ttl)
	w.Seen("n/l", 1, 30*time.Second, 0)
	if got := w.Seen("n/l", 1, 30*time.Second, 20*time.Second); got != Alive {
		t.Fatalf("at 20 s of a 30 s lease: %s", got)
	}
	if got := w.Seen("n/l", 1, 30*time.Second, 30*time.Second); got != Silent {
		t.Fatalf("at 30 s of a 30 s lease: %s", got)
	}
}

// A lifecycle this node never saw present is judged by the TTL its records
// name when that is longer than this node's own: a node with a shorter
// lease must not end a longer one early.
func TestNeverSeenOwnerIsJudgedByItsOwnTTL(t *testing.T) {
	w := New(ttl)
	long := 3 * ttl
	if v, _ := w.Missing("x/l", long, 0); v != Ending {
		t.Fatalf("at first sight: %s", v)
	}
	if v, _ := w.Missing("x/l", long, 2*ttl); v != Ending {
		t.Fatalf("after the watcher's TTL twice, of a lease three times longer: %s", v)
	}
	if v, _ := w.Missing("x/l", long, long); v != Ended {
		t.Fatalf("after the owner's TTL: %s", v)
	}
	w.Missing("y/l", ttl/2, 0)
	if v, _ := w.Missing("y/l", ttl/2, ttl/2); v != Ending {
		t.Fatalf("a shorter TTL than the watcher's does not shorten the wait below its own: %s", v)
	}
	if v, _ := w.Missing("y/l", ttl/2, ttl); v != Ended {
		t.Fatalf("after the watcher's own TTL: %s", v)
	}
}

// A descriptor that went is Ended only a TTL after this node first saw it
// gone — even when the version it last saw had stood still for a TTL (the
// holder may have renewed after that look, unseen, before the store ended
// its lease early) — unless this node revoked the lease itself.
func TestMissingWaitsATTLUnlessRevokedHere(t *testing.T) {
	w := New(ttl)
	w.Seen("n/l", 1, 0, 0)
	if v, _ := w.Missing("n/l", 0, 12*time.Second); v != Ending {
		t.Fatalf("first seen gone at 12 s: %s", v)
	}
	if v, _ := w.Missing("n/l", 0, 21*time.Second); v != Ending {
		t.Fatalf("seen gone for 9 s: %s", v)
	}
	if v, _ := w.Missing("n/l", 0, 22*time.Second); v != Ended {
		t.Fatalf("seen gone for 10 s: %s", v)
	}

	w.Seen("m/l", 1, 0, 0)
	if w.Seen("m/l", 1, 0, ttl) != Silent {
		t.Fatal("not silent")
	}
	w.Revoked("m/l", ttl)
	if v, _ := w.Missing("m/l", 0, ttl); v != Ended {
		t.Fatalf("revoked here: %s", v)
	}
}

// A lifecycle seen again after it was missing starts afresh, and Forget
// drops what was seen before a time.
func TestSeenAgainAndForget(t *testing.T) {
	w := New(ttl)
	w.Missing("n/l", 0, 0)
	w.Seen("n/l", 4, 0, time.Second)
	if v, _ := w.Missing("n/l", 0, 2*time.Second); v != Ending {
		t.Fatalf("gone again: %s", v)
	}
	w.Forget(time.Hour)
	if len(w.beats) != 0 || len(w.gone) != 0 {
		t.Fatalf("left %d beats, %d gone", len(w.beats), len(w.gone))
	}
}
