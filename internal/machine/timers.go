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
	s.arm(k, d, func(fired Fired[K]) {
		if s.Take(fired) {
			f()
		}
	})
}

// Fired is one arming of a timer posted into its machine's mailbox (Post):
// the machine takes it with Take, on its own goroutine.
type Fired[K comparable] struct {
	Key K
	gen uint64
}

// Post is Arm for a machine that takes its events on its own goroutine:
// once d has passed, post hands the firing to that goroutine (to its
// mailbox), and the machine steps it only if Take says it is still the
// current arming. A timer cancelled or re-armed after it fired but before
// the machine took it is so still dropped: the core never sees the event
// of a timer it stopped.
func (s *Timers[K]) Post(k K, d time.Duration, post func(Fired[K])) { s.arm(k, d, post) }

// arm replaces the timer under k by a new arming, whose firing goes to
// fire.
func (s *Timers[K]) arm(k K, d time.Duration, fire func(Fired[K])) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if old := s.armed[k]; old != nil {
		old.timer.Stop()
	}
	s.gen++
	f := Fired[K]{Key: k, gen: s.gen}
	n := &namedTimer{gen: f.gen}
	s.armed[k] = n
	n.timer = s.clock.AfterFunc(d, func() { fire(f) })
}

// Take reports whether f is still the current arming of its timer, and
// if so disarms it: the machine steps the timer's event only then.
func (s *Timers[K]) Take(f Fired[K]) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.armed[f.Key]
	if cur == nil || cur.gen != f.gen {
		return false
	}
	delete(s.armed, f.Key)
	return true
}

// CancelIf cancels every armed timer whose name matches: the timers a run
// that ended left armed, whichever they are.
func (s *Timers[K]) CancelIf(match func(K) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.armed {
		if match(k) {
			n.timer.Stop()
			delete(s.armed, k)
		}
	}
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
