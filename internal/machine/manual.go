package machine

import (
	"container/heap"
	"sync"
	"time"
)

// Manual is a logical clock: time stands still until the test advances it,
// and a timer fires only then, in the order of its due time (arming order
// among equal ones), on the advancing goroutine. A node run on Manual makes
// no decision because the machine was slow: a lease, a cutover wait or a
// follow window ends exactly when the test says. One goroutine advances
// it: with two advancing at once, timers would no longer run in due order.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers timerHeap
	fired  uint64
}

// NewManual starts a logical clock at a fixed instant.
func NewManual() *Manual {
	return &Manual{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now is the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// AfterFunc arms f to run once the clock has advanced by d. A d ≤ 0 timer
// is due at once and runs at the next Advance (even Advance(0)).
func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	t := &manualTimer{m: m, at: m.now.Add(max(d, 0)), seq: m.seq, f: f, index: -1}
	heap.Push(&m.timers, t)
	return t
}

// Advance moves the clock forward by d, stopping at each due timer to run
// it (outside the clock's lock, so it may arm more: one due within the
// advance runs too). It returns the number of timers run.
func (m *Manual) Advance(d time.Duration) int {
	m.mu.Lock()
	end := m.now.Add(max(d, 0))
	n := 0
	for len(m.timers) > 0 && !m.timers[0].at.After(end) {
		t := heap.Pop(&m.timers).(*manualTimer)
		if t.at.After(m.now) {
			m.now = t.at
		}
		m.fired++
		m.mu.Unlock()
		t.f()
		n++
		m.mu.Lock()
	}
	// A timer's function may have advanced the clock further: time never
	// goes back.
	if end.After(m.now) {
		m.now = end
	}
	m.mu.Unlock()
	return n
}

// AdvanceToNext moves the clock to the earliest armed timer and runs every
// timer due then; false if none is armed.
func (m *Manual) AdvanceToNext() bool {
	next, ok := m.Next()
	if !ok {
		return false
	}
	m.Advance(next.Sub(m.Now()))
	return true
}

// Next is when the earliest armed timer is due.
func (m *Manual) Next() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.timers) == 0 {
		return time.Time{}, false
	}
	return m.timers[0].at, true
}

// Armed is the number of timers waiting to fire.
func (m *Manual) Armed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.timers)
}

// Fired is the number of timers run so far.
func (m *Manual) Fired() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fired
}

type manualTimer struct {
	m     *Manual
	at    time.Time
	seq   uint64
	f     func()
	index int // in the heap; -1 once fired or stopped
}

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.m.timers, t.index)
	return true
}

type timerHeap []*manualTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}

// NewManualAt starts a logical clock at t: a node test starts it at the
// real time, so deadlines its callers take from the real clock stay
// comparable with the node's.
func NewManualAt(t time.Time) *Manual { return &Manual{now: t} }
