package activation

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// world answers an Activation's effects at random, on a scripted clock,
// and checks after every step what must hold whatever the store does.
type world struct {
	t   *testing.T
	rng *rand.Rand
	a   *Activation
	now time.Time

	pending          []Event // answers not yet fed
	timers           map[Timer]time.Time
	locked, capacity bool
	staged, opened   bool
	reserved         bool // this attempt's reservation applied, not yet committed Ready
	tookOver         bool // this attempt's takeover applied: it is never released (abort)
	aborted          bool
	written          *location.Record // the last write's record, which a settling read may find
	finished         int
	trace            []string
}

func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("%s\ntrace:\n%v", fmt.Sprintf(format, args...), w.trace)
}

// answer runs one effect: I/O effects get a random answer.
func (w *world) answer(e Effect) {
	w.trace = append(w.trace, reflect.TypeOf(e).Name())
	if w.finished > 0 {
		w.fail("%T after Finish", e)
	}
	r := w.rng.IntN(10)
	storeErr := func() error {
		switch w.rng.IntN(4) {
		case 0:
			return location.ErrConflict
		case 1:
			return location.ErrIndeterminate
		case 2:
			return location.ErrUnavailable
		}
		return nil
	}
	switch e := e.(type) {
	case LockKey:
		if w.locked {
			w.fail("locked twice")
		}
		w.locked = true
		w.pending = append(w.pending, KeyLocked{Now: w.now})
	case UnlockKey:
		if !w.locked {
			w.fail("unlock without lock")
		}
		w.locked = false
	case ReadAuthority:
		w.reserved, w.tookOver, w.aborted = false, false, false // a new attempt
		var ev AuthorityRead
		switch r {
		case 0:
			ev.Err = roamerr.ErrUnavailable
		case 1, 2, 3:
			ev.Authority.Versioned = location.Versioned{Key: cartKey}
		case 4:
			ev.Authority = Authority{Versioned: record(5, ready, other, nil), Address: "n2:1"}
		case 5:
			ev.Authority = Authority{Versioned: record(5, creating, other, receipt(w.now.Add(time.Second))), Address: "n2:1"}
		case 6:
			ev.Authority = Authority{Versioned: record(5, ready, other, receipt(time.Time{})), OwnerEnded: true}
		case 7:
			ev.Authority = Authority{Versioned: record(5, ready, other, nil), OwnerEnded: true}
		default:
			ev.Authority = Authority{Versioned: record(5, creating, self, receipt(w.now)), Hosted: r == 9}
		}
		ev.Now = w.now
		w.pending = append(w.pending, ev)
	case Watch:
		w.pending = append(w.pending, Watched{Now: w.now})
	case AdmitCapacity:
		if r == 0 {
			w.pending = append(w.pending, CapacityAdmitted{Err: roamerr.ErrCapacityExceeded})
			return
		}
		w.capacity = true
		w.pending = append(w.pending, CapacityAdmitted{})
	case ReleaseCapacity:
		if !w.capacity {
			w.fail("capacity released twice")
		}
		w.capacity = false
	case PutRoot:
		var err error
		if r == 0 {
			err = errStore
		}
		w.pending = append(w.pending, RootPut{Ref: location.RootRef{Key: e.RootKey}, Err: err})
	case GetRoot:
		ev := RootGot{Ref: storedRef, Operation: storedOp, First: "stored"}
		switch r {
		case 0:
			ev.Err = location.ErrNotFound
		case 1:
			ev.Err = errStore
		}
		w.pending = append(w.pending, ev)
	case Reserve, CompareAndSet:
		err := storeErr()
		if err == nil {
			w.noteApplied()
		}
		w.pending = append(w.pending, WriteAnswered{Version: 9, Err: err, Now: w.now})
	case ReadRecord:
		// a settling read: mine, another's, none, or an error
		ev := RecordRead{Now: w.now}
		switch r {
		case 0, 1:
			ev.Err = errStore
		case 2:
			ev.Err = location.ErrNotFound
		case 3:
			ev.Record = record(11, creating, other, nil)
		default:
			ev.Record = location.Versioned{Key: cartKey, Version: 10, Record: w.written}
			w.noteApplied()
		}
		w.pending = append(w.pending, ev)
	case Stage:
		if r == 0 {
			w.pending = append(w.pending, Staged{Err: roamerr.ErrUnavailable})
			return
		}
		w.staged = true
		w.pending = append(w.pending, Staged{})
	case DiscardStaged:
		if !w.staged {
			w.fail("discard without staged")
		}
		w.staged = false
	case Open:
		if !w.staged {
			w.fail("open without staged")
		}
		w.opened = true
		w.pending = append(w.pending, Opened{})
	case AbortReservation:
		if w.tookOver {
			w.fail("a takeover was released: the interrupted activation's root and record would go")
		}
		w.aborted = true
		w.pending = append(w.pending, AbortAnswered{Err: storeErr()})
	case PassOn:
		w.pending = append(w.pending, PassedOn{OK: r < 5})
	case StartTimer:
		at := e.At
		if at.IsZero() {
			at = w.now.Add(e.After)
		}
		w.timers[e.Timer] = at
	case StopTimer:
		delete(w.timers, e.Timer)
	case Finish:
		w.finished++
	case DeleteRoot, Forward, Measure, Log, RespondFailure:
	default:
		w.fail("unexpected effect %T", e)
	}
}

// noteApplied records that the current write applied.
func (w *world) noteApplied() {
	switch w.a.Phase() {
	case Reserving:
		w.reserved = true
	case TakingOver:
		w.tookOver = true
	case Committing:
		w.reserved = false // Ready: the pointer, not an abort, covers a failure now
	}
}

// Whatever the store answers (conflicts, indeterminate outcomes, failures,
// every kind of record) and however time passes, an activation ends once,
// by its deadline at the latest, and gives back what it held: the Spot
// ID's lock, the creation slot, a staged incarnation (opened or
// discarded), and a reservation that a failure before the Ready commit
// would strand (released with its fence). 3,000 seeded schedules; every
// ending is reached.
// Reference: docs/PROTOCOL.md §7.5, §7.6, §7.7.
func TestRandomizedActivation(t *testing.T) {
	ends := map[Phase]int{}
	for seed := uint64(1); seed <= 3000; seed++ {
		w := &world{t: t, rng: rand.New(rand.NewPCG(seed, 7)), now: t0, timers: map[Timer]time.Time{}}
		a, effects := NewActivation(cfg, start(Kind{Registered: true, PreservesState: seed%3 == 0, ReactivateEmpty: seed%2 == 0}))
		w.a = a
		for steps := 0; ; steps++ {
			if steps > 10000 {
				w.fail("seed %d: no end after %d steps", seed, steps)
			}
			for _, e := range effects {
				switch e := e.(type) {
				case Reserve:
					w.written = e.Record
				case CompareAndSet:
					w.written = e.Record
				}
				w.answer(e)
			}
			if w.finished > 0 {
				break
			}
			w.now = w.now.Add(time.Duration(w.rng.IntN(300)) * time.Millisecond)
			var ev Event
			if len(w.pending) > 0 {
				if len(w.pending) > 1 {
					w.fail("seed %d: %d answers outstanding", seed, len(w.pending))
				}
				ev, w.pending = w.pending[0], nil
			} else {
				// Nothing in flight: the earliest timer fires.
				var next Timer
				for tm, at := range w.timers {
					if next == 0 || at.Before(w.timers[next]) {
						next = tm
					}
				}
				if next == 0 {
					w.fail("seed %d: the machine waits for nothing in %s", seed, a.Phase())
				}
				if at := w.timers[next]; at.After(w.now) {
					w.now = at
				}
				delete(w.timers, next)
				ev = TimerFired{Timer: next, Now: w.now}
			}
			w.trace = append(w.trace, fmt.Sprintf("<%T", ev))
			effects = a.Step(ev)
		}
		require.True(t, a.Phase().Terminal(), "seed %d ends in %s", seed, a.Phase())
		ends[a.Phase()]++
		require.Equal(t, 1, w.finished, "seed %d", seed)
		require.False(t, w.locked, "seed %d: the Spot ID stays locked", seed)
		require.False(t, w.capacity, "seed %d: a creation slot stays taken", seed)
		if w.staged && !w.opened {
			w.fail("seed %d: a staged incarnation is neither opened nor discarded", seed)
		}
		if a.Phase() == Failed && w.reserved && !w.aborted && !w.opened {
			w.fail("seed %d: a failed activation left its reservation", seed)
		}
		if a.Phase() == Failed && a.Err() == nil {
			w.fail("seed %d: failed without an error", seed)
		}
		require.Empty(t, a.Step(TimerFired{Timer: TimerDeadline, Now: w.now}))
	}
	for _, p := range []Phase{Activated, Forwarded, HandedOn, Failed} {
		require.NotZero(t, ends[p], "no schedule ended %s: %v", p, ends)
	}
}
