// Package ratelog bounds how often one log event is written. Whatever a
// peer can trigger at will (a refused control message, a refused frame)
// is logged through a Limiter, so that a flood of them cannot flood the
// log; each written line says how many were left out since the last.
package ratelog

import (
	"sync"
	"time"
)

// Limiter lets one event through per Every; the zero value lets one per
// 100 ms.
type Limiter struct {
	Every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether to log now and how many events were not logged
// since the last one that was.
func (l *Limiter) Allow() (ok bool, suppressed int) {
	every := l.Every
	if every == 0 {
		every = 100 * time.Millisecond
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < every {
		l.suppressed++
		return false, 0
	}
	l.last, suppressed, l.suppressed = now, l.suppressed, 0
	return true, suppressed
}
