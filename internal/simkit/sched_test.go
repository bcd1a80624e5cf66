package simkit

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

// Events run in time order; events due at one instant run in the order
// they were scheduled, whatever the heap's shape, and an event scheduled
// in the past runs now, after what is already due.
func TestSchedOrderAndTies(t *testing.T) {
	var s Sched
	var got []string
	add := func(at time.Duration, name string) { s.At(at, func() { got = append(got, name) }) }
	add(30*ms, "c1")
	add(10*ms, "a1")
	add(30*ms, "c2")
	add(20*ms, "b")
	add(10*ms, "a2")
	add(30*ms, "c3")
	s.At(10*ms, func() {
		got = append(got, "a3")
		add(0, "a4") // in the past: now, after a3's peers
		s.After(-ms, func() { got = append(got, "a5") })
	})
	if !s.Run(time.Hour, 0, nil) {
		t.Fatal("Run reported a livelock with no step limit")
	}
	want := []string{"a1", "a2", "a3", "a4", "a5", "b", "c1", "c2", "c3"}
	if !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
	if s.Now() != 30*ms || s.Steps() != len(want) {
		t.Fatalf("now %s after %d steps, want 30ms after %d", s.Now(), s.Steps(), len(want))
	}
}

// Many events at few instants keep (time, scheduling order) order: the
// heap never lets a later-scheduled event of one instant pass an earlier.
func TestSchedTiesAtScale(t *testing.T) {
	var s Sched
	r := NewRand(1, 2)
	type ev struct {
		at  time.Duration
		seq int
	}
	var got []ev
	for i := range 2000 {
		at := time.Duration(r.IntN(7)) * ms
		s.At(at, func() { got = append(got, ev{at, i}) })
	}
	s.Run(time.Hour, 0, nil)
	if len(got) != 2000 {
		t.Fatalf("%d events ran, want 2000", len(got))
	}
	for i := 1; i < len(got); i++ {
		a, b := got[i-1], got[i]
		if a.at > b.at || (a.at == b.at && a.seq > b.seq) {
			t.Fatalf("event %d (at %s, scheduled %d) ran before event at %s scheduled %d", i-1, a.at, a.seq, b.at, b.seq)
		}
	}
}

// Run stops before the first event past end and leaves it queued; stop
// ends it early; more than maxSteps events is a livelock.
func TestSchedRunBounds(t *testing.T) {
	var s Sched
	ran := 0
	s.At(10*ms, func() { ran++ })
	s.At(50*ms, func() { ran++ })
	s.Run(20*ms, 0, nil)
	if ran != 1 || s.Pending() != 1 || s.Now() != 10*ms {
		t.Fatalf("ran %d, %d pending, now %s; want 1, 1, 10ms", ran, s.Pending(), s.Now())
	}
	s.AdvanceTo(20 * ms)
	s.AdvanceTo(5 * ms)
	if s.Now() != 20*ms {
		t.Fatalf("now %s after AdvanceTo(20ms), AdvanceTo(5ms); want 20ms", s.Now())
	}

	var loop Sched
	var tick func()
	tick = func() { loop.After(0, tick) }
	loop.At(0, tick)
	if loop.Run(time.Second, 100, nil) {
		t.Fatal("an event that reschedules itself at one instant ran out without a livelock")
	}
	if loop.Steps() != 101 {
		t.Fatalf("the livelock stopped after %d steps, want 101", loop.Steps())
	}

	var st Sched
	n := 0
	for i := range 10 {
		st.At(time.Duration(i)*ms, func() { n++ })
	}
	st.Run(time.Second, 0, func() bool { return n >= 3 })
	if n != 3 {
		t.Fatalf("stop after 3 events: %d ran", n)
	}
}

// Dur stays in [lo, hi] and reaches both ends; Dur with an empty range and
// Chance(0) draw nothing, so a fault that is off leaves later draws where
// they were.
func TestRandDrawsNothingWhenOff(t *testing.T) {
	a, b := NewRand(7, 9), NewRand(7, 9)
	if a.Dur(5*ms, 5*ms) != 5*ms || a.Dur(5*ms, ms) != 5*ms || a.Chance(0) || a.Chance(-1) {
		t.Fatal("empty range or zero chance gave a draw's answer")
	}
	if x, y := a.Uint64(), b.Uint64(); x != y {
		t.Fatalf("a draw moved: %d, want %d", x, y)
	}
	lo, hi := false, false
	for range 10000 {
		d := a.Dur(0, 3)
		if d < 0 || d > 3 {
			t.Fatalf("Dur(0, 3) = %d", d)
		}
		lo, hi = lo || d == 0, hi || d == 3
	}
	if !lo || !hi {
		t.Fatalf("Dur(0, 3) never reached an end: 0 %v, 3 %v", lo, hi)
	}
	if !a.Chance(1) {
		t.Fatal("Chance(1) was false")
	}
}

// RunTo records a livelock as a violation and still moves the clock to the
// end for the end-state checks; a schedule stops at MaxViolations.
func TestHarnessRunTo(t *testing.T) {
	h := NewHarness(1, 1)
	h.SetTracing(true)
	var tick func()
	tick = func() { h.After(0, tick) }
	h.At(ms, tick)
	h.RunTo(time.Second, 50)
	vs := h.Violations()
	if len(vs) != 1 || vs[0].Invariant != "livelock" || vs[0].At != ms {
		t.Fatalf("violations %v, want one livelock at 1ms", vs)
	}
	if h.Now() != time.Second {
		t.Fatalf("now %s after RunTo(1s), want 1s", h.Now())
	}
	if want := "     1.000ms  VIOLATION 1.000ms livelock: more than 50 steps before 1s"; h.Trace() != want {
		t.Fatalf("trace %q, want %q", h.Trace(), want)
	}

	g := NewHarness(1, 1)
	for i := range 100 {
		g.At(time.Duration(i)*ms, func() { g.Violate("bad", "%d", i) })
	}
	g.RunTo(time.Second, 0)
	if n := len(g.Violations()); n != MaxViolations {
		t.Fatalf("%d violations recorded, want the schedule stopped at %d", n, MaxViolations)
	}
	if g.TraceLines() != 0 {
		t.Fatalf("%d lines traced with tracing off", g.TraceLines())
	}
}

// RunSchedule runs the events to the end, then the checks in order, and
// returns what they found.
func TestRunSchedule(t *testing.T) {
	h := NewHarness(1, 1)
	var order []string
	h.At(5*time.Millisecond, func() { order = append(order, "event") })
	vs := h.RunSchedule(10*time.Millisecond,
		func() { order = append(order, "a"); h.Violate("end", "at %s", h.Now()) },
		func() { order = append(order, "b") })
	if got := strings.Join(order, " "); got != "event a b" {
		t.Errorf("ran %q, want the event, then the checks in order", got)
	}
	if len(vs) != 1 || vs[0].Invariant != "end" || vs[0].At != 10*time.Millisecond {
		t.Errorf("violations %v, want the check's at the end time", vs)
	}
}
