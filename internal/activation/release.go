package activation

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// errChanged is logged when a revert lost to another write.
var errChanged = errors.New("the record changed since the Closing write")

// Release runs a close after its Closing write (docs/PROTOCOL.md §7.9):
// the local incarnation handles what it accepted and stops, then the
// authority goes with the same fence — a delete of the record while it is
// still Closing at the closed generation under this owner, read again
// after every failure or unclear answer, within ReleaseFor of the start
// (the caller's deadline may be spent by the accepted turns). A Spot that
// turned out to be moving is put back to Ready and the close ends
// Unavailable.
type Release struct {
	cfg       Config
	key       location.AuthorityKey
	gen       uint64
	closingAt location.StoreVersion
	wasReady  *location.Record
	deadline  time.Time
	now       time.Time
	expired   bool
	phase     Phase
	closeErr  error
	lastErr   error
	rootKey   string
	write     *Write
	err       error
	finished  bool
}

// NewRelease starts the close of key's incarnation gen, whose Closing
// write produced version closingAt over the Ready record wasReady, at now.
func NewRelease(cfg Config, key location.AuthorityKey, gen uint64, closingAt location.StoreVersion, wasReady *location.Record, now time.Time) (*Release, []Effect) {
	r := &Release{cfg: cfg, key: key, gen: gen, closingAt: closingAt, wasReady: wasReady, deadline: now.Add(cfg.ReleaseFor), now: now, phase: ClosingLocal}
	return r, []Effect{
		DropRoute{SpotID: key.ID}, // a reader now sees Closing, which is never cached
		StartTimer{Timer: TimerDeadline, At: r.deadline},
		CloseLocal{Key: key, Generation: gen},
	}
}

// Phase is the current phase.
func (r *Release) Phase() Phase { return r.phase }

// Finished reports whether the machine has emitted Finish.
func (r *Release) Finished() bool { return r.finished }

// Err is the close's result once finished.
func (r *Release) Err() error { return r.err }

// Step feeds one event and returns the effects to run, in order.
func (r *Release) Step(ev Event) []Effect {
	if r.finished {
		return nil
	}
	if now, ok := nowOf(ev); ok && !now.IsZero() {
		r.now = now
	}
	if t, ok := ev.(TimerFired); ok && t.Timer == TimerDeadline {
		r.expired = true
	}
	switch r.phase {
	case ClosingLocal:
		if ev, ok := ev.(LocalClosed); ok {
			if errors.Is(ev.Err, roamerr.ErrUnavailable) {
				r.closeErr = ev.Err
				r.write = NewCompareAndSet(r.cfg, r.key, r.closingAt, r.wasReady, r.deadline)
				r.phase = Reverting
				return r.write.Start()
			}
			var effects []Effect
			if ev.Err != nil && !errors.Is(ev.Err, roamerr.ErrNotFound) {
				// The incarnation is ended and stops itself after its
				// accepted turns; nothing new reaches it.
				effects = append(effects, Log{Level: loglevel.Warn, Event: "close_local_slow", SpotID: r.key.ID, Err: ev.Err,
					Msg: "the closed incarnation is still finishing accepted turns"})
			}
			return append(effects, r.read()...)
		}
	case Reverting:
		effects := r.write.Step(ev)
		if !r.write.Done() {
			return effects
		}
		switch outcome, _, err := r.write.Result(); outcome {
		case Lost:
			effects = append(effects, r.revertFailed(errChanged))
		case WriteFailed:
			effects = append(effects, r.revertFailed(err))
		}
		return r.finish(CloseReverted, r.closeErr, effects...)
	case ReleaseReading:
		if ev, ok := ev.(RecordRead); ok {
			switch {
			case errors.Is(ev.Err, location.ErrNotFound):
				return r.finish(AuthorityReleased, nil)
			case ev.Err != nil:
				r.lastErr = ev.Err
				return r.wait()
			}
			rec := ev.Record.Record
			if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_CLOSING || rec.GetObjectGeneration() != r.gen || !SameOwner(rec.GetOwner(), r.cfg.Self) {
				return r.finish(ReleaseFailed, fmt.Errorf("%w: %s changed while closing", roamerr.ErrStale, r.key))
			}
			r.rootKey = rec.GetActivationRecovery().GetRecoveryKey()
			r.phase = ReleaseDeleting
			return []Effect{Delete{Key: r.key, Version: ev.Record.Version, Record: ev.Record.Record}}
		}
	case ReleaseDeleting:
		if ev, ok := ev.(Deleted); ok {
			if ev.Err == nil {
				var effects []Effect
				if r.rootKey != "" {
					effects = append(effects, DeleteRoot{RootKey: r.rootKey})
				}
				return r.finish(AuthorityReleased, nil, effects...)
			}
			r.lastErr = ev.Err
			if errors.Is(ev.Err, location.ErrLeaseEnded) {
				return r.giveUp() // never retried under an ended lease
			}
			return r.wait()
		}
	case ReleaseWaiting:
		if t, ok := ev.(TimerFired); ok {
			switch t.Timer {
			case TimerRetry:
				return r.read()
			case TimerDeadline:
				return r.giveUp()
			}
		}
	}
	return nil
}

func (r *Release) revertFailed(err error) Effect {
	return Log{Level: loglevel.Error, Event: "spot_close_revert_failed", SpotID: r.key.ID, Err: err, Msg: "a moving Spot stays Closing"}
}

func (r *Release) read() []Effect {
	r.phase = ReleaseReading
	return []Effect{ReadRecord{Key: r.key}}
}

func (r *Release) wait() []Effect {
	if r.expired || passed(r.deadline, r.now) {
		return r.giveUp()
	}
	r.phase = ReleaseWaiting
	return []Effect{StartTimer{Timer: TimerRetry, After: r.cfg.ReleaseBackoff}}
}

func (r *Release) giveUp() []Effect {
	return r.finish(ReleaseFailed, StoreError("release "+r.key.String(), r.lastErr),
		Log{Level: loglevel.Error, Event: "spot_release_failed", SpotID: r.key.ID, Err: r.lastErr, Msg: "a closed Spot's authority stays Closing"})
}

func (r *Release) finish(p Phase, err error, before ...Effect) []Effect {
	r.phase = p
	r.err = err
	r.finished = true
	return append(before, Finish{Err: err})
}
