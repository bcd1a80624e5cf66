package machine

import (
	"sync"
	"time"
)

// Timers is the named timers of one driver: the host arms, re-arms and
// cancels them by name and closes them all together when the driver
// stops, so no timer outlives its machine. A timer that was re-armed,
// cancelled or closed before its function started does not run, even if
// its clock had already fired it (each arming has its own generation), so
// a cancelled timer's event never reaches the core.
type Timers[K comparable] struct {
	clock  Clock
	mu     sync.Mutex
	armed  map[K]*namedTimer
	gen    uint64
	closed bool
}

type namedTimer struct {
	gen   uint64
	timer Timer
}

// NewTimers is an empty set on c (Real when nil).
func NewTimers[K comparable](c Clock) *Timers[K] {
	return &Timers[K]{clock: Or(c), armed: map[K]*namedTimer{}}
}

// Clock is the clock the set arms its timers on.
func (s *Timers[K]) Clock() Clock { return s.clock }

// Arm runs f once d has passed, replacing any timer armed under k. It does
// nothing once the set is closed.
func (s *Timers[K]) Arm(k K, d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if old := s.armed[k]; old != nil {
		old.timer.Stop()
	}
	s.gen++
	gen := s.gen
	n := &namedTimer{gen: gen}
	s.armed[k] = n
	n.timer = s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		cur := s.armed[k]
		if cur == nil || cur.gen != gen {
			s.mu.Unlock()
			return
		}
		delete(s.armed, k)
		s.mu.Unlock()
		f()
	})
}

// ArmAt is Arm with an absolute due time on the set's clock.
func (s *Timers[K]) ArmAt(k K, at time.Time, f func()) { s.Arm(k, Until(s.clock, at), f) }

// Cancel stops the timer armed under k and reports whether one was.
func (s *Timers[K]) Cancel(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.armed[k]
	if n == nil {
		return false
	}
	n.timer.Stop()
	delete(s.armed, k)
	return true
}

// Armed reports whether a timer is armed under k (not yet started).
func (s *Timers[K]) Armed(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed[k] != nil
}

// Len is the number of armed timers.
func (s *Timers[K]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.armed)
}

// Close cancels every armed timer; later Arms do nothing.
func (s *Timers[K]) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, n := range s.armed {
		n.timer.Stop()
		delete(s.armed, k)
	}
}
