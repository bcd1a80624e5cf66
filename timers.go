package roam

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/relocation"
)

// TimerSet is the timers of one relocatable actor (Timers): they move
// with it, registrations, schedules and ticks not yet handled included,
// so the application never registers them again after a move. A timer
// delivers a *messages.TimerTick carrying its name. Use it only from the
// actor's own Receive: it is not safe for other goroutines.
type TimerSet struct{ t relocation.TimerSet }

// Timers returns the timers of the relocatable actor whose context c is;
// InvalidOperation for any other actor.
func Timers(c actor.Context) (TimerSet, error) {
	t, err := relocation.Timers(c)
	return TimerSet{t}, err
}

// A TimerOption configures a periodic timer (TimerSet.Every).
type TimerOption struct{ o relocation.TimerOption }

// CatchUp makes a periodic timer whose ticks fell behind deliver up to
// limit missed ticks at once. Default: missed ticks are skipped and
// counted.
func CatchUp(limit uint32) TimerOption { return TimerOption{relocation.CatchUp(limit)} }

// Every delivers a tick named name every period (positive), from now.
func (s TimerSet) Every(name string, period time.Duration, opts ...TimerOption) error {
	in := make([]relocation.TimerOption, 0, len(opts))
	for _, o := range opts {
		if o.o != nil {
			in = append(in, o.o)
		}
	}
	return s.t.Every(name, period, in...)
}

// After delivers one tick named name after delay.
func (s TimerSet) After(name string, delay time.Duration) error { return s.t.After(name, delay) }

// Cancel removes the timer name; a tick of it not yet handled is not
// delivered.
func (s TimerSet) Cancel(name string) { s.t.Cancel(name) }

// Names lists the registered timers.
func (s TimerSet) Names() []string { return s.t.Names() }
