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
//
// The set keeps its armings in a heap by due time and arms one clock timer,
// for the earliest. A driver arms several timeouts per operation and
// cancels nearly all of them; with a clock timer each, every arming cost a
// runtime timer, its closures and a copy of the name in each (about a
// tenth of a relocation's allocations). An arming's entry is reused once
// it is cancelled or taken.
type Timers[K comparable] struct {
	clock Clock
	mu    sync.Mutex
	// armed is every arming not yet cancelled nor taken: those waiting in
	// due (index ≥ 0) and those fired and waiting for Take (index -1).
	armed map[K]*arming[K]
	// due is a min-heap of the armings not yet fired, by due time and
	// then arming order (gen).
	due  []*arming[K]
	free []*arming[K]
	gen  uint64
	// wake is the clock timer armed for wakeAt, the due time of due[0]
	// when it was armed (nil: none); wakeGen tells a wake that was
	// replaced from the current one.
	wake    Timer
	wakeAt  time.Time
	wakeGen uint64
	// onFire is the firing function of the armings that name none (Post).
	onFire func(Fired[K])
	closed bool
}

// arming is one arming of a named timer.
type arming[K comparable] struct {
	key   K
	at    time.Time
	gen   uint64
	fire  func(Fired[K]) // nil: the set's onFire
	index int            // in due, or -1 once fired
}

// NewTimers is an empty set on c (Real when nil).
func NewTimers[K comparable](c Clock) *Timers[K] {
	return &Timers[K]{clock: Or(c), armed: map[K]*arming[K]{}}
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
// of a timer it stopped. A nil post is the set's own (OnFire): such an
// arming allocates nothing.
func (s *Timers[K]) Post(k K, d time.Duration, post func(Fired[K])) { s.arm(k, d, post) }

// OnFire sets where the armings posted with no function of their own go.
// Set it before the first such arming.
func (s *Timers[K]) OnFire(post func(Fired[K])) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onFire = post
}

// arm replaces the timer under k by a new arming, whose firing goes to
// fire.
func (s *Timers[K]) arm(k K, d time.Duration, fire func(Fired[K])) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	a := s.armed[k]
	switch {
	case a == nil:
		a = s.newArming(k)
		s.armed[k] = a
	case a.index >= 0:
		s.remove(a.index)
	}
	s.gen++
	a.at, a.gen, a.fire = s.clock.Now().Add(max(d, 0)), s.gen, fire
	s.push(a)
	s.rewake()
}

func (s *Timers[K]) newArming(k K) *arming[K] {
	if n := len(s.free); n > 0 {
		a := s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		a.key = k
		return a
	}
	return &arming[K]{key: k}
}

// release forgets a, which is in armed and no longer in due.
func (s *Timers[K]) release(a *arming[K]) {
	delete(s.armed, a.key)
	var zero K
	a.key, a.fire, a.index = zero, nil, -1
	if len(s.free) < 64 {
		s.free = append(s.free, a)
	}
}

// rewake arms the clock timer for the earliest arming, unless it is armed
// for that or earlier already (an earlier wake finds nothing due and arms
// the next one). With nothing due it stops it.
func (s *Timers[K]) rewake() {
	if len(s.due) == 0 {
		if s.wake != nil {
			s.wake.Stop()
			s.wake = nil
		}
		return
	}
	at := s.due[0].at
	if s.wake != nil && !at.Before(s.wakeAt) {
		return
	}
	if s.wake != nil {
		s.wake.Stop()
	}
	s.wakeGen++
	gen := s.wakeGen
	s.wake, s.wakeAt = s.clock.AfterFunc(Until(s.clock, at), func() { s.expire(gen) }), at
}

// expire fires every arming due by now, in due order, and arms the clock
// timer for the next one.
func (s *Timers[K]) expire(gen uint64) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if gen == s.wakeGen {
		s.wake = nil
	}
	now := s.clock.Now()
	var fired []Fired[K]
	var fns []func(Fired[K])
	for len(s.due) > 0 && !s.due[0].at.After(now) {
		a := s.due[0]
		s.remove(0)
		fire := a.fire
		if fire == nil {
			fire = s.onFire
		}
		fired, fns = append(fired, Fired[K]{Key: a.key, gen: a.gen}), append(fns, fire)
	}
	s.rewake()
	s.mu.Unlock()
	for i, f := range fired {
		fns[i](f)
	}
}

// Take reports whether f is still the current arming of its timer, and
// if so disarms it: the machine steps the timer's event only then.
func (s *Timers[K]) Take(f Fired[K]) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.armed[f.Key]
	if a == nil || a.gen != f.gen || a.index >= 0 {
		return false
	}
	s.release(a)
	return true
}

// cancel forgets the arming a.
func (s *Timers[K]) cancel(a *arming[K]) {
	if a.index >= 0 {
		s.remove(a.index)
	}
	s.release(a)
}

// CancelIf cancels every armed timer whose name matches: the timers a run
// that ended left armed, whichever they are.
func (s *Timers[K]) CancelIf(match func(K) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, a := range s.armed {
		if match(k) {
			s.cancel(a)
		}
	}
	s.rewake()
}

// ArmAt is Arm with an absolute due time on the set's clock.
func (s *Timers[K]) ArmAt(k K, at time.Time, f func()) { s.Arm(k, Until(s.clock, at), f) }

// Cancel stops the timer armed under k and reports whether one was.
func (s *Timers[K]) Cancel(k K) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.armed[k]
	if a == nil {
		return false
	}
	s.cancel(a)
	s.rewake()
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
	for _, a := range s.armed {
		s.cancel(a)
	}
	s.rewake()
}

// The heap of due armings, by due time and then arming order; each
// arming knows its index, so a cancel removes it in O(log n).

func (s *Timers[K]) less(i, j int) bool {
	a, b := s.due[i], s.due[j]
	return a.at.Before(b.at) || a.at.Equal(b.at) && a.gen < b.gen
}

func (s *Timers[K]) swap(i, j int) {
	s.due[i], s.due[j] = s.due[j], s.due[i]
	s.due[i].index, s.due[j].index = i, j
}

func (s *Timers[K]) push(a *arming[K]) {
	a.index = len(s.due)
	s.due = append(s.due, a)
	s.up(a.index)
}

// remove takes the arming at i out of due.
func (s *Timers[K]) remove(i int) {
	n := len(s.due) - 1
	a := s.due[i]
	if i != n {
		s.swap(i, n)
	}
	s.due[n] = nil
	s.due = s.due[:n]
	if i != n {
		if !s.down(i) {
			s.up(i)
		}
	}
	a.index = -1
}

func (s *Timers[K]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !s.less(j, i) {
			break
		}
		s.swap(i, j)
		j = i
	}
}

func (s *Timers[K]) down(i0 int) bool {
	i, n := i0, len(s.due)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && s.less(r, j) {
			j = r
		}
		if !s.less(j, i) {
			break
		}
		s.swap(i, j)
		i = j
	}
	return i > i0
}
