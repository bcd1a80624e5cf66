package simkit

import "time"

// Base is the wall-clock instant of logical time 0: the machines the
// simulations drive take absolute deadlines.
var Base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Wall is the wall-clock instant of logical time d.
func Wall(d time.Duration) time.Time { return Base.Add(d) }

// Logical is the logical time of the wall-clock instant t.
func Logical(t time.Time) time.Duration { return t.Sub(Base) }

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

// Sched is an event queue on a logical clock: a binary heap ordered by
// time, then by the order events were scheduled in, so that events due at
// the same instant run in a fixed order and a seed replays exactly. The
// zero Sched is empty at time 0. Not safe for concurrent use.
type Sched struct {
	now   time.Duration
	seq   uint64
	queue []event
	steps int
}

// Now is the logical time: the time of the event running, or of the last
// one run.
func (s *Sched) Now() time.Duration { return s.now }

// Steps is the number of events run.
func (s *Sched) Steps() int { return s.steps }

// Pending is the number of events scheduled and not run yet.
func (s *Sched) Pending() int { return len(s.queue) }

// At schedules fn at logical time t; a time in the past means now (it runs
// after what is already due now).
func (s *Sched) At(t time.Duration, fn func()) {
	if t < s.now {
		t = s.now
	}
	s.seq++
	s.queue = append(s.queue, event{at: t, seq: s.seq, fn: fn})
	s.up(len(s.queue) - 1)
}

// After schedules fn d from now (a negative d means now).
func (s *Sched) After(d time.Duration, fn func()) { s.At(s.now+max(d, 0), fn) }

// Run runs events in order until none is due at or before end, stop (if
// not nil) reports true before a step, or more than maxSteps events have
// run in all (if maxSteps > 0). It returns false in the last case: a
// schedule that keeps scheduling work at one instant is a livelock, not a
// hang. Now stays at the last event run; AdvanceTo moves it on.
func (s *Sched) Run(end time.Duration, maxSteps int, stop func() bool) bool {
	for len(s.queue) > 0 && (stop == nil || !stop()) {
		if s.queue[0].at > end {
			break
		}
		e := s.pop()
		s.now = e.at
		e.fn()
		s.steps++
		if maxSteps > 0 && s.steps > maxSteps {
			return false
		}
	}
	return true
}

// AdvanceTo moves the clock to t if it is earlier (end-state checks read
// the time the schedule ends at, not that of its last event).
func (s *Sched) AdvanceTo(t time.Duration) {
	if s.now < t {
		s.now = t
	}
}

func (s *Sched) less(i, j int) bool {
	a, b := &s.queue[i], &s.queue[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (s *Sched) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s.queue[i], s.queue[p] = s.queue[p], s.queue[i]
		i = p
	}
}

func (s *Sched) down(i int) {
	n := len(s.queue)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.queue[i], s.queue[m] = s.queue[m], s.queue[i]
		i = m
	}
}

func (s *Sched) pop() event {
	e := s.queue[0]
	last := len(s.queue) - 1
	s.queue[0] = s.queue[last]
	s.queue[last] = event{} // drop the closure for the collector
	s.queue = s.queue[:last]
	if last > 0 {
		s.down(0)
	}
	return e
}
