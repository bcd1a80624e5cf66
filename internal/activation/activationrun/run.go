// Package activationrun interprets the effects of one machine of package
// activation (an activation, a recovery, a pointer's clear, a release, a
// record write): the order in which effects run, one at a time and each
// to its end before the next; the answers, stepped in the order they came
// and never from inside an effect; the machine's timers, whose fires wait
// until nothing else is left to step; the deadline each store call runs
// under; and what a machine that ended still held. It talks to its host
// only through Env, the host's primitives, so the Spot driver
// (internal/spot) runs it on the Location Store, the node's clock and
// Proto.Actor, and the deterministic simulation runs the same code
// against its simulated store, network and clock.
//
// A Runner is not safe for concurrent use: its host calls it from one
// goroutine (the driver's caller, the simulation's scheduler).
package activationrun

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Deadline is what bounds a store or node call.
type Deadline int

const (
	// OperationDeadline: the operation's own deadline (the driver's
	// context).
	OperationDeadline Deadline = iota + 1
	// OwnTimeout: a timeout of the call's own, from now. A call that
	// settles or undoes an outcome runs past the operation's deadline;
	// the machine bounds the settling itself.
	OwnTimeout
)

// Arming is one arming of a machine timer. A fire counts only for the
// arming it was made for: a timer stopped or armed again meanwhile does
// not reach the machine with its earlier fire.
type Arming struct {
	Timer activation.Timer
	Seq   uint64
}

// Env is what a machine of package activation needs of its host. The
// primitives that answer do so by Runner.Answer, exactly once, at once
// (from inside the call) or later; the others return when done.
type Env interface {
	// Gone reports that the host can no longer run the machine (its node
	// is down): nothing more runs, nothing is given back.
	Gone() bool
	// Stepped is told each step (ev nil: the machine's first effects),
	// for tracing.
	Stepped(ev activation.Event, effects []activation.Effect)
	// Before is called before each effect runs.
	Before(e activation.Effect)
	// Now is the host's clock, the time a timer's fire is stepped at.
	Now() time.Time

	// Lock waits for the Spot ID's lock on the node: KeyLocked.
	Lock(spotID string)
	Unlock()
	// ReadAuthority: AuthorityRead.
	ReadAuthority(spotID string, d Deadline)
	// Watch: Watched.
	Watch(key location.AuthorityKey, after location.StoreVersion, d Deadline)
	// AdmitCapacity: CapacityAdmitted; admitted, the node holds a
	// pending place until ReleaseCapacity.
	AdmitCapacity(d Deadline)
	ReleaseCapacity()
	// PutRoot stores the SpotActivation's recovery root: RootPut.
	PutRoot(rootKey string, d Deadline)
	// GetRoot: RootGot.
	GetRoot(rootKey string, d Deadline)
	// Reserve, CompareAndSet: WriteAnswered.
	Reserve(e activation.Reserve, d Deadline)
	CompareAndSet(e activation.CompareAndSet, d Deadline)
	// ReadRecord: RecordRead.
	ReadRecord(key location.AuthorityKey, d Deadline)
	// AbortReservation: AbortAnswered.
	AbortReservation(e activation.AbortReservation, d Deadline)
	// Delete: Deleted.
	Delete(e activation.Delete, d Deadline)
	// DeleteRoot deletes a root (a failure is the host's to log); it
	// answers nil when done.
	DeleteRoot(rootKey string, d Deadline)
	// ReadOwner: OwnerRead.
	ReadOwner(owner *messages.Owner, d Deadline)
	// ClaimCheckpoint: CheckpointClaimed.
	ClaimCheckpoint(e activation.ClaimCheckpoint, d Deadline)
	// Stage: Staged.
	Stage(e activation.Stage, d Deadline)
	DiscardStaged()
	// Open: Opened.
	Open(e activation.Open, d Deadline)
	// PassOn: PassedOn.
	PassOn(d Deadline)
	// CloseLocal: LocalClosed.
	CloseLocal(e activation.CloseLocal, d Deadline)

	Forward(e activation.Forward)
	RespondFailure(err error)
	DropRoute(spotID string)
	Measure(e activation.Measure)
	Log(l activation.Log)

	// Arm arms a to call Runner.Fire(a) after after, or at at if it is
	// not zero, replacing any arming of a.Timer; Stop stops it. A fire of
	// an arming that no longer counts is dropped by the Runner.
	Arm(a Arming, after time.Duration, at time.Time)
	Stop(t activation.Timer)

	// Stalled: the machine waits for nothing (a machine defect); the run
	// ends with ErrUnavailable.
	Stalled()
	// Done: the run ended with err, after what it held was given back.
	Done(err error)
}

// ErrStalled is the error of a run whose machine waits for nothing.
var ErrStalled = fmt.Errorf("%w: spot: a machine waits for nothing", roamerr.ErrUnavailable)

// Runner runs one machine's effects on an Env.
type Runner struct {
	step func(activation.Event) []activation.Effect
	env  Env

	effects []activation.Effect
	idx     int
	queue   []activation.Event
	// awaiting: an effect runs and its answer has not come.
	awaiting bool
	// running: advance is on the stack; an answer or a fire that comes
	// now is only queued (no re-entry).
	running bool

	seq   uint64
	live  map[activation.Timer]uint64
	fired []activation.Timer

	locked, admitted bool

	finished, done bool
	err            error
}

// New returns a runner of the machine whose Step is step.
func New(step func(activation.Event) []activation.Effect, env Env) *Runner {
	return &Runner{step: step, env: env, live: map[activation.Timer]uint64{}}
}

// Start runs the machine's first effects and what they lead to, until an
// effect waits for its answer, the machine waits for a timer or the run
// ends.
func (r *Runner) Start(effects []activation.Effect) {
	r.env.Stepped(nil, effects)
	r.effects, r.idx = effects, 0
	r.advance()
}

// Done reports that the run ended; Err is then its error.
func (r *Runner) Done() bool { return r.done }

// Err is the error the run ended with.
func (r *Runner) Err() error { return r.err }

// Idle reports a run that waits only for a timer.
func (r *Runner) Idle() bool { return !r.done && !r.awaiting && !r.running }

// Answer is the answer of the effect that runs (nil: it completed with
// nothing to step). It is stepped after every event that came before it.
func (r *Runner) Answer(ev activation.Event) {
	if r.done || r.env.Gone() {
		return
	}
	if !r.awaiting {
		panic(fmt.Sprintf("activationrun: an answer nothing waits for: %T", ev))
	}
	r.awaiting = false
	if ev != nil {
		if _, ok := ev.(activation.KeyLocked); ok {
			r.locked = true
		}
		if c, ok := ev.(activation.CapacityAdmitted); ok && c.Err == nil {
			r.admitted = true
		}
		r.queue = append(r.queue, ev)
	}
	if !r.running {
		r.advance()
	}
}

// Fire is a's expiry. It reaches the machine once nothing else is left to
// step, and not at all if a's timer was stopped or armed again.
func (r *Runner) Fire(a Arming) {
	if r.done || r.env.Gone() || r.live[a.Timer] != a.Seq || a.Seq == 0 {
		return
	}
	delete(r.live, a.Timer)
	r.fired = append(r.fired, a.Timer)
	if !r.running && !r.awaiting {
		r.advance()
	}
}

// advance runs effects until one waits for its answer, then steps the
// next answer, then a fired timer.
func (r *Runner) advance() {
	r.running = true
	defer func() { r.running = false }()
	env := r.env
	for !r.done && !env.Gone() {
		if r.awaiting {
			return
		}
		if r.idx < len(r.effects) {
			e := r.effects[r.idx]
			r.idx++
			env.Before(e)
			if env.Gone() {
				return
			}
			r.exec(e)
			continue
		}
		if r.finished {
			r.complete()
			return
		}
		var ev activation.Event
		switch {
		case len(r.queue) > 0:
			ev, r.queue = r.queue[0], r.queue[1:]
		case len(r.fired) > 0:
			t := r.fired[0]
			r.fired = r.fired[1:]
			ev = activation.TimerFired{Timer: t, Now: env.Now()}
		case len(r.live) == 0:
			env.Stalled()
			r.err = ErrStalled
			r.complete()
			return
		default:
			return // idle until a timer fires
		}
		r.effects, r.idx = r.step(ev), 0
		env.Stepped(ev, r.effects)
	}
}

// exec runs one effect; an effect with an answer leaves the runner
// awaiting it.
func (r *Runner) exec(e activation.Effect) {
	env := r.env
	wait := func() { r.awaiting = true }
	switch e := e.(type) {
	case activation.LockKey:
		wait()
		env.Lock(e.SpotID)
	case activation.UnlockKey:
		if r.locked {
			r.locked = false
			env.Unlock()
		}
	case activation.ReadAuthority:
		wait()
		env.ReadAuthority(e.SpotID, OperationDeadline)
	case activation.Watch:
		wait()
		env.Watch(e.Key, e.After, OperationDeadline)
	case activation.AdmitCapacity:
		wait()
		env.AdmitCapacity(OperationDeadline)
	case activation.ReleaseCapacity:
		if r.admitted {
			r.admitted = false
			env.ReleaseCapacity()
		}
	case activation.PutRoot:
		wait()
		env.PutRoot(e.RootKey, OperationDeadline)
	case activation.GetRoot:
		wait()
		env.GetRoot(e.RootKey, OperationDeadline)
	case activation.Reserve:
		wait()
		env.Reserve(e, OperationDeadline)
	case activation.CompareAndSet:
		wait()
		env.CompareAndSet(e, settling(e.Settle))
	case activation.ReadRecord:
		wait()
		env.ReadRecord(e.Key, settling(e.Settle))
	case activation.AbortReservation:
		wait()
		env.AbortReservation(e, OwnTimeout) // undoes past the deadline
	case activation.Delete:
		wait()
		env.Delete(e, OperationDeadline)
	case activation.DeleteRoot:
		wait()
		env.DeleteRoot(e.RootKey, OwnTimeout) // cleanup, past the deadline
	case activation.ReadOwner:
		wait()
		env.ReadOwner(e.Owner, OperationDeadline)
	case activation.ClaimCheckpoint:
		wait()
		env.ClaimCheckpoint(e, OperationDeadline)
	case activation.Stage:
		wait()
		env.Stage(e, OperationDeadline)
	case activation.DiscardStaged:
		env.DiscardStaged()
	case activation.Open:
		wait()
		env.Open(e, OperationDeadline)
	case activation.Forward:
		env.Forward(e)
	case activation.PassOn:
		wait()
		env.PassOn(OperationDeadline)
	case activation.RespondFailure:
		env.RespondFailure(e.Err)
	case activation.CloseLocal:
		wait()
		env.CloseLocal(e, OperationDeadline)
	case activation.DropRoute:
		env.DropRoute(e.SpotID)
	case activation.Measure:
		env.Measure(e)
	case activation.Log:
		env.Log(e)
	case activation.StartTimer:
		r.dropFired(e.Timer)
		r.seq++
		r.live[e.Timer] = r.seq
		env.Arm(Arming{Timer: e.Timer, Seq: r.seq}, e.After, e.At)
	case activation.StopTimer:
		r.stop(e.Timer)
	case activation.Finish:
		r.finished, r.err = true, e.Err
	default:
		panic(fmt.Sprintf("activationrun: no driver for effect %T", e))
	}
}

func settling(settle bool) Deadline {
	if settle {
		return OwnTimeout
	}
	return OperationDeadline
}

// stop stops t, a fire of it not yet stepped included.
func (r *Runner) stop(t activation.Timer) {
	delete(r.live, t)
	r.dropFired(t)
	r.env.Stop(t)
}

func (r *Runner) dropFired(t activation.Timer) {
	if i := slices.Index(r.fired, t); i >= 0 {
		r.fired = slices.Delete(r.fired, i, i+1)
	}
}

// complete ends the run: its timers stop, and what the machine still
// held (a pending place, the Spot ID's lock) is given back before the
// host learns the outcome.
func (r *Runner) complete() {
	for _, t := range slices.Sorted(maps.Keys(r.live)) {
		r.stop(t)
	}
	r.fired = nil
	if r.admitted {
		r.admitted = false
		r.env.ReleaseCapacity()
	}
	if r.locked {
		r.locked = false
		r.env.Unlock()
	}
	r.done = true
	r.env.Done(r.err)
}
