// Package ratelog bounds how often one log event is written. Whatever a
// peer can trigger at will (a refused control message, a refused frame)
// is logged through a Limiter, so that a flood of them cannot flood the
// log; each written line says how many were left out since the last.
package ratelog

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
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

// Warn is a warning event on log with the count of those left out since
// the last, or nil (whose methods do nothing) when one was written less
// than Every ago.
func (l *Limiter) Warn(log *zerolog.Logger) *zerolog.Event {
	ok, left := l.Allow()
	if !ok {
		return nil
	}
	return log.Warn().Int("not_logged_since", left)
}

// Clip shortens what a peer chose (an address, a reason naming it) before
// it goes into a log line.
func Clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
