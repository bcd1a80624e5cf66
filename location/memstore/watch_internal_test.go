package memstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// A watch wakes for its own key's change only, and a watch that gives up
// leaves nothing behind: a write to another key does not end it, and the
// key's channel goes with its last watcher.
func TestWatchWakesForItsOwnKeyOnly(t *testing.T) {
	s := New()
	ctx := context.Background()
	rec := &location.Record{State: messages.LifecycleState_LIFECYCLE_STATE_READY, ObjectGeneration: 1}
	a, b := location.Key(location.KindActor, "a"), location.Key(location.KindActor, "b")
	va, err := s.Apply(ctx, []location.Op{location.CreateOp(a, rec)})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan location.Versioned, 1)
	go func() {
		v, _ := s.Watch(ctx, a, va[0])
		got <- v
	}()
	testwait.For(t, func() bool { return s.watchers(a) == 1 }, "the watch of a to wait")
	if _, err := s.Apply(ctx, []location.Op{location.CreateOp(b, rec)}); err != nil {
		t.Fatal(err)
	}
	if s.watchers(a) != 1 {
		t.Fatal("a write to b woke the watch of a")
	}
	vb, err := s.Apply(ctx, []location.Op{location.UpdateOp(a, va[0], rec)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v.Version != vb[0] {
			t.Fatalf("the watch returned version %d, want %d", v.Version, vb[0])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch of a did not return within 5 s of a's change")
	}

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	missing := location.Key(location.KindActor, "never")
	if _, err := s.Watch(short, missing, 0); !errors.Is(err, location.ErrUnavailable) {
		t.Fatalf("a watch past its deadline: %v, want ErrUnavailable", err)
	}
	if n := s.watchers(missing); n != 0 {
		t.Fatalf("%d watchers left on a key nobody watches", n)
	}
	s.mu.Lock()
	left := len(s.watched)
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d keys' channels left", left)
	}
}

// watchers is how many watches wait on key.
func (s *Store) watchers(key location.AuthorityKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.watched[key]; w != nil {
		return w.n
	}
	return 0
}
