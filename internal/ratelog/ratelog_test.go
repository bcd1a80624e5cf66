package ratelog

import (
	"testing"
	"time"
)

func TestLimiterLetsOnePerIntervalAndCountsTheRest(t *testing.T) {
	l := &Limiter{Every: time.Hour}
	if ok, n := l.Allow(); !ok || n != 0 {
		t.Fatalf("first: %v %d", ok, n)
	}
	for i := 0; i < 5; i++ {
		if ok, _ := l.Allow(); ok {
			t.Fatal("a second event within the interval was let through")
		}
	}
	l.mu.Lock()
	l.last = time.Now().Add(-2 * time.Hour)
	l.mu.Unlock()
	if ok, n := l.Allow(); !ok || n != 5 {
		t.Fatalf("after the interval: %v %d", ok, n)
	}
}
