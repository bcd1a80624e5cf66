// Package sourcerun interprets the effects of a move's Source machine
// (handoff.Source): the step loop and the choreography of every effect
// that orders messages or picks what to write. It talks to its host only
// through Env, the environment's primitives (mailbox operations, sends to
// the target, store calls, timers, capture), so the driver runs it with
// Proto.Actor, roam's mailbox and the Location Store, and the
// deterministic simulation runs the same code against its simulated
// network, store and clock.
//
// A Run is used from one goroutine (the driver's, the simulation's
// scheduler); only Parked's sink is called from others, under its lock.
package sourcerun

import (
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
)

// Env is what a move out of a node needs of its host. M is the host's
// message type, R its store record. Participant i is the move's
// participant i (0: the object the move names). Calls that answer later
// do so by Run.Step (or Run.Captured, Run.Read) on the run's goroutine.
type Env[M, R any] interface {
	// Gone reports that the host can no longer run the move (its node is
	// down): nothing more is stepped.
	Gone() bool
	// Stepped is told every step, for tracing.
	Stepped(ev handoff.Event, effects []handoff.Effect)
	// Before is called before each effect runs.
	Before(e handoff.Effect)

	// The participant's mailbox (mailbox.Mailbox semantics).
	Seal(i int) error // the capture comes by Run.Captured
	Unseal(i int, front []M) error
	Reopen(i int, front func() []M) error
	Redirect(i int, sink func(M)) error

	// The participant's incarnation.
	Leaving(i int)  // sealing for the move
	Serving(i int)  // its seal never took: serving, queue untouched
	Unsealed(i int) // its queue is back after a seal: timers re-armed, serving
	Following(i int)
	// Unregister drops the participant's incarnation from the node's
	// registry, if it is still the registered one.
	Unregister(i int)
	// Conflict reports another incarnation of the participant's object
	// registered on the node.
	Conflict(i int) bool
	Reinstated(i int) // serving again after a fence-out, registered
	FollowSink(i int) func(M)
	// EndFollow marks the incarnation ended and returns the sink that
	// answers its messages unavailable.
	EndFollow(i int) func(M)
	CloseOut(i int)
	StopIncarnation(i int)
	// LateSealUndone: a seal that came after the move gave up on it was
	// undone (err: restoring the queue failed).
	LateSealUndone(i int, err error)

	// IsRequest reports a message that expects a reply.
	IsRequest(m M) bool
	// Refuse fails or drops a message a Parked hold does not keep.
	Refuse(i int, m M, why Refusal)

	QueryCapability() handoff.Event // nil: the answer comes later
	Admit() handoff.Event           // nil: admitted later
	// CheckSource sends the target the source check; its answer comes
	// later, as handoff.SourceChecked.
	CheckSource()
	EncodePayload() (envelope.Stream, error)
	SendPrepare(e handoff.SendPrepare)
	SendChunks(e handoff.SendChunks)
	SendAbort(e handoff.SendAbort)
	// EncodeRelay turns a message of participant i into its relayed
	// record: record is what the relay sum covers, wire what SendRelay
	// sends. An error: the message cannot cross nodes (RelayRefused).
	EncodeRelay(i int, m M) (record []byte, wire any, err error)
	RelayRefused(i int, m M, err error)
	// SendRelay sends a record of the boundary batch; again: a resend of
	// one sent before (the first copy may be the receiver's now).
	SendRelay(r Relayed[M], epoch uint32, again bool)
	SendCutover(epoch uint32, sum handoff.RelaySum)

	// BoundTo names the Session owner participant i is bound to and its
	// Actor's ID (owner "": not bound, or its binding was dropped).
	BoundTo(i int) (owner, actor string)
	// SendSessionSeal sends command 42 for participant i to its Session
	// owner; the answer comes by Run.SessionSealReply.
	SendSessionSeal(i int)
	// SendSessionAbort sends command 44 for participant i, one-way.
	SendSessionAbort(i int)
	// DropBinding forgets participant i's Session binding: the move goes
	// on unbound, its target's record carries none.
	DropBinding(i int, why string)
	// SessionOwnersGone reports which of the Session owners' nodes are no
	// live member of the mesh; now false: the answer comes later by
	// Run.SessionOwnersLooked.
	SessionOwnersGone(owners []string) (gone map[string]bool, now bool)

	// Store calls; each answers by Run.Read or a FenceOutAnswered step.
	Reconcile()
	ConfirmCommit(after uint64, until time.Time)
	// FenceOut writes the move's RelocationId into read, owner
	// unchanged, by CAS at read's version.
	FenceOut(read R, version uint64)
	// NoFenceOutRead answers a FenceOut of a version no read saw: a
	// FenceOutAnswered with a conflict, later.
	NoFenceOutRead(version uint64)

	StartTimer(t handoff.StartTimer)
	StopTimer(t handoff.Timer)
	// StopTimers stops every timer of the run but keep (0: none).
	StopTimers(keep handoff.Timer)

	PayloadReleased()
	// ReturnBudget gives back the move's in-flight budget
	// (handoff.ReturnBudget).
	ReturnBudget()
	// BoundaryUnacknowledged: the boundary batch is dropped without the
	// target's acknowledgement; its messages may be lost (loudly).
	BoundaryUnacknowledged(batch []Relayed[M])
	Log(l handoff.Log)
	// Problem reports a primitive that failed (one event name each).
	Problem(i int, event string, err error, msg string)
	Complete(err error)
	// Ended: the move is over (once); only TimerStub may still run.
	Ended()
	// Forgotten: the machine is Forgettable; the run is dropped.
	Forgotten()
}

// Refusal is why a Parked hold does not keep a message.
type Refusal int

const (
	// RefuseReconciling: a request while the move's outcome is
	// reconciled, before relay-ready (it fails at once).
	RefuseReconciling Refusal = iota + 1
	// RefuseOverflow: MaxParked messages wait already.
	RefuseOverflow
)

// Part is one participant's share of a move.
type Part[M any] struct {
	Sealed   bool // its mailbox was sealed (Unseal reopens only those)
	Captured bool // its capture came (a seal still pending is undone when it does)
	Saved    []M  // the saved-work prefix, for Unseal and Reinstate
	Relayed  []M  // its share of the boundary batch as posted, for Reinstate
	Parked   *Parked[M]
	Held     *Parked[M] // the hold after the cutover, until StartFollow or Reinstate
	// Session is where a bound participant's seal request stands;
	// abortLater: its Session abort waits for its late seal to be undone.
	Session    SessionSeal
	abortLater bool
}

// Relayed is one record of the boundary batch.
type Relayed[M any] struct {
	Part   int
	Index  int // in the batch
	Msg    M
	Record []byte
	Wire   any
}

// Run is one move out of a node.
type Run[M, R any] struct {
	m     *handoff.Source
	env   Env[M, R]
	Parts []*Part[M]
	batch []Relayed[M] // until ReleaseBoundary, for resends
	sum   handoff.RelaySum
	// lastRead is the record the last successful read saw, for a
	// FenceOut of its version.
	lastRead     R
	lastReadView handoff.RecordView
	// awaiting counts the captures still to come after the seal;
	// captureErr is the first that failed.
	awaiting   int
	captureErr error
	// sessionsAwaiting counts the seal requests to Session owners not
	// answered yet.
	sessionsAwaiting int
	ended            bool
	forgotten        bool
}

// New builds the run of machine m over parts (one per participant).
func New[M, R any](m *handoff.Source, env Env[M, R], parts []*Part[M]) *Run[M, R] {
	return &Run[M, R]{m: m, env: env, Parts: parts}
}

// Machine is the run's Source machine.
func (r *Run[M, R]) Machine() *handoff.Source { return r.m }

// Ended reports that the move is over.
func (r *Run[M, R]) Ended() bool { return r.ended }

// Forgotten reports that the run was dropped.
func (r *Run[M, R]) Forgotten() bool { return r.forgotten }

// Awaiting reports captures still awaited after the seal.
func (r *Run[M, R]) Awaiting() bool { return r.awaiting > 0 }

// Batch is the boundary batch held for resends.
func (r *Run[M, R]) Batch() []Relayed[M] { return r.batch }

// Step feeds ev and runs the effects in order; events the effects produce
// at once are fed after the current effects, in order.
func (r *Run[M, R]) Step(ev handoff.Event) {
	if r.forgotten || r.env.Gone() {
		return
	}
	queue := []handoff.Event{ev}
	for len(queue) > 0 {
		ev, queue = queue[0], queue[1:]
		effects := r.m.Step(ev)
		r.env.Stepped(ev, effects)
		for _, e := range effects {
			r.env.Before(e)
			if r.env.Gone() {
				return
			}
			if next := r.effect(e); next != nil {
				queue = append(queue, next)
			}
		}
	}
	if r.m.Finished() && !r.ended {
		r.ended = true
		r.env.StopTimers(handoff.TimerStub)
		r.env.Ended()
	}
	if r.m.Forgettable() && !r.forgotten {
		r.forgotten = true
		r.env.StopTimers(0)
		r.env.Forgotten()
	}
}

// Captured takes participant i's capture (saved: its saved-work prefix;
// err: the capture failed). Once every participant's has come, the
// payload is encoded and the move goes on. A capture no seal awaits any
// more (the move gave up or ended) is undone at once.
func (r *Run[M, R]) Captured(i int, saved []M, err error) {
	if r.awaiting == 0 {
		r.UnsealLate(i, saved)
		return
	}
	p := r.Parts[i]
	p.Saved, p.Captured = saved, true
	if err != nil && r.captureErr == nil {
		r.captureErr = err
	}
	if r.awaiting--; r.awaiting > 0 {
		return
	}
	if r.captureErr != nil {
		r.Step(handoff.CaptureFailed{Err: r.captureErr})
		return
	}
	stream, err := r.env.EncodePayload()
	if err != nil {
		r.Step(handoff.CaptureFailed{Err: err})
		return
	}
	r.Step(handoff.Captured{Stream: stream})
}

// UnsealLate undoes participant i's seal that took effect after its move
// gave up on it: it serves again with what it held, in order. Its Session
// abort, held back until now, goes once its queue is back.
func (r *Run[M, R]) UnsealLate(i int, saved []M) {
	err := r.unsealPart(i, saved)
	if p := r.Parts[i]; p.abortLater {
		p.abortLater = false
		r.env.SendSessionAbort(i)
	}
	r.env.LateSealUndone(i, err)
}

// Read feeds a store read to the move (ev.Err nil: rec is what it read),
// keeping the record for a FenceOut of its version.
func (r *Run[M, R]) Read(ev handoff.ReconcileRead, rec R) {
	if r.forgotten || r.env.Gone() {
		return
	}
	if ev.Err == nil {
		r.lastRead, r.lastReadView = rec, ev.Record
	}
	r.Step(ev)
}

func (r *Run[M, R]) effect(e handoff.Effect) handoff.Event {
	env := r.env
	switch e := e.(type) {
	case handoff.QueryCapability:
		return env.QueryCapability()

	case handoff.AwaitAdmission:
		return env.Admit()

	case handoff.CheckSource:
		env.CheckSource()

	case handoff.SealSessions:
		return r.sealSessions()

	case handoff.LookUpSessionOwners:
		return r.lookUpSessionOwners()

	case handoff.AbortSessions:
		r.abortSessions()

	case handoff.Seal:
		return r.seal()

	case handoff.SendPrepare:
		env.SendPrepare(e)

	case handoff.SendChunks:
		env.SendChunks(e)

	case handoff.Unseal:
		// No capture is awaited any more: a seal still pending is undone
		// when it takes effect (Captured → UnsealLate).
		r.awaiting = 0
		for i, p := range r.Parts {
			if !p.Sealed {
				env.Serving(i)
				continue
			}
			if !p.Captured {
				continue
			}
			if err := r.unsealPart(i, p.Saved); err != nil {
				env.Problem(i, "unseal_failed", err, "restoring the source queue failed")
			}
		}

	case handoff.SendAbort:
		env.SendAbort(e)

	case handoff.RelayThenCutover:
		return r.relayThenCutover(e.Epoch)

	case handoff.ResendBoundary:
		for _, b := range r.batch {
			env.SendRelay(b, e.Epoch, true)
		}
		env.SendCutover(e.Epoch, r.sum)

	case handoff.ReleasePayload:
		// The batch's wire copy stays for resends until ReleaseBoundary.
		for _, p := range r.Parts {
			p.Saved, p.Relayed = nil, nil
		}
		env.PayloadReleased()

	case handoff.ReturnBudget:
		env.ReturnBudget()

	case handoff.ReleaseBoundary:
		if e.Unacknowledged && len(r.batch) > 0 {
			env.BoundaryUnacknowledged(r.batch)
		}
		r.batch = nil

	case handoff.StartFollow:
		for i, p := range r.Parts {
			r.startFollow(i, p.Held, "follow_failed")
			p.Held = nil
		}

	case handoff.ConfirmCommit:
		env.ConfirmCommit(e.After, e.Until)

	case handoff.FenceOut:
		// Only the record read at that version: a CAS against any other
		// could fence out a record the machine never judged.
		if !r.lastReadView.Present || r.lastReadView.Version != e.Version {
			env.NoFenceOutRead(e.Version)
			break
		}
		env.FenceOut(r.lastRead, e.Version)

	case handoff.CloseOut:
		for i := range r.Parts {
			env.CloseOut(i)
		}

	case handoff.Reinstate:
		r.reinstate()

	case handoff.EndFollow:
		for i := range r.Parts {
			if err := env.Redirect(i, env.EndFollow(i)); err != nil {
				env.Problem(i, "end_follow_failed", err, "")
			}
		}

	case handoff.StopIncarnation:
		for i := range r.Parts {
			env.StopIncarnation(i)
		}

	case handoff.Reconcile:
		env.Reconcile()

	case handoff.AdoptTargetRoute:
		for i, p := range r.Parts {
			r.startFollow(i, p.Parked, "adopt_route_failed")
			p.Parked = nil
			env.Unregister(i)
			env.CloseOut(i)
		}

	case handoff.FailHeld:
		for i, p := range r.Parts {
			if p.Parked == nil {
				p.Parked = r.newParked(i, false)
				if err := env.Redirect(i, p.Parked.Sink); err != nil {
					env.Problem(i, "park_failed", err, "")
				}
			}
		}

	case handoff.StartTimer:
		env.StartTimer(e)

	case handoff.StopTimer:
		env.StopTimer(e.Timer)

	case handoff.Log:
		env.Log(e)

	case handoff.Complete:
		env.Complete(e.Err)

	default:
		panic("sourcerun: unknown source effect " + typeName(e))
	}
	return nil
}

// seal seals every participant after its current turn; each captures on
// its own goroutine and the payload is built once all have (one seal of
// the unit, one payload: PROTOCOL.md §5.4, §5.15).
func (r *Run[M, R]) seal() handoff.Event {
	r.awaiting, r.captureErr = len(r.Parts), nil
	for i, p := range r.Parts {
		r.env.Leaving(i)
		if err := r.env.Seal(i); err != nil {
			// The parts before it are sealed: their captures still come,
			// then the move unseals them.
			r.captureErr = err
			r.awaiting -= len(r.Parts) - i
			if r.awaiting == 0 {
				return handoff.CaptureFailed{Err: err}
			}
			break
		}
		p.Sealed = true
	}
	return nil
}

// unsealPart gives a sealed participant its queue back: saved first, then
// what was parked while reconciling, then later posts.
func (r *Run[M, R]) unsealPart(i int, saved []M) error {
	p := r.Parts[i]
	var err error
	if held := p.Parked; held != nil {
		err = r.env.Reopen(i, func() []M { return append(saved, held.Take()...) })
		p.Parked = nil
	} else {
		err = r.env.Unseal(i, saved)
	}
	p.Saved, p.Sealed = nil, false
	r.env.Unsealed(i)
	return err
}

// relayThenCutover relays the ingress hold in order (the sends parked
// while reconciling first), holds later messages (requests included)
// until the target's commit shows in the store, when they go on by
// Message Follow, and sends the cutover after the last relayed record
// (PROTOCOL.md §5.8, §5.9). Both switches happen under the mailbox's
// lock, so every message is either in the batch or held, never both.
func (r *Run[M, R]) relayThenCutover(epoch uint32) handoff.Event {
	env := r.env
	for i, p := range r.Parts {
		relay := func(m M) { r.relay(i, epoch, m) }
		if p.Parked != nil {
			// A relay-ready that arrived while reconciling: the parked
			// sends are the head of the ingress hold.
			p.Parked.Release(relay)
			p.Parked = nil
		}
		if err := env.Redirect(i, relay); err != nil {
			env.Problem(i, "relay_failed", err, "")
		}
		// Later messages wait here, requests too, in order, until the move
		// is decided: StartFollow forwards them once the commit shows; a
		// fence-out puts them back into this incarnation's queue
		// (Reinstate). Nothing reaches the target before its commit, so
		// nothing is stranded at a removed one.
		env.Following(i)
		p.Held = r.newParked(i, true)
		if err := env.Redirect(i, p.Held.Sink); err != nil {
			env.Problem(i, "hold_failed", err, "")
		}
		env.Unregister(i)
	}
	env.SendCutover(epoch, r.sum)
	return handoff.CutoverSent{Sum: r.sum}
}

func (r *Run[M, R]) relay(i int, epoch uint32, m M) {
	rec, wire, err := r.env.EncodeRelay(i, m)
	if err != nil {
		r.env.RelayRefused(i, m, err)
		return
	}
	r.sum = r.sum.Add(rec)
	b := Relayed[M]{Part: i, Index: len(r.batch), Msg: m, Record: rec, Wire: wire}
	r.batch = append(r.batch, b)
	r.Parts[i].Relayed = append(r.Parts[i].Relayed, m)
	r.env.SendRelay(b, epoch, false)
}

// startFollow switches participant i to Message Follow: what held kept (if
// anything) goes to the target first, in order, then every later message.
func (r *Run[M, R]) startFollow(i int, held *Parked[M], failEvent string) {
	r.env.Following(i)
	follow := r.env.FollowSink(i)
	if held != nil {
		held.Release(follow)
	}
	if err := r.env.Redirect(i, follow); err != nil {
		r.env.Problem(i, failEvent, err, "")
	}
}

// reinstate serves the move's participants on the source again after a
// fence-out following the cutover: the saved work, then the boundary
// batch, ahead of everything held since, in one critical section of the
// mailbox (it leaves the hold for Open).
func (r *Run[M, R]) reinstate() {
	for i, p := range r.Parts {
		if r.env.Conflict(i) {
			r.env.Problem(i, "reinstate_conflict", nil, "another incarnation is registered here; the fenced-out move's object is not reinstated")
			continue
		}
		backlog := append(append([]M(nil), p.Saved...), p.Relayed...)
		held := p.Held
		p.Held = nil
		err := r.env.Reopen(i, func() []M {
			if held != nil {
				return append(backlog, held.Take()...)
			}
			return backlog
		})
		if err != nil {
			r.env.Problem(i, "reinstate_failed", err, "serving the fenced-out move's object again failed")
			continue
		}
		r.env.Reinstated(i)
	}
}

func (r *Run[M, R]) newParked(i int, holdRequests bool) *Parked[M] {
	return &Parked[M]{holdRequests: holdRequests, isRequest: r.env.IsRequest, refuse: func(m M, why Refusal) { r.env.Refuse(i, m, why) }}
}
