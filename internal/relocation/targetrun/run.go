// Package targetrun interprets the effects of a move's Target machine
// (handoff.Target): the step loop and the choreography of every effect
// that orders messages or decides an outcome — what the restored payload
// puts in the backlog and in which order, the open's backlog (saved work,
// then the relayed records, then later messages), the owner commit
// through handoff.Commit, removal, forgetting. It talks to its host only
// through Env, the environment's primitives (staged incarnations, sends
// to the source, store calls, timers, decoding), so the driver runs it
// with Proto.Actor, roam's mailbox and the Location Store, and the
// deterministic simulation runs the same code against its simulated
// network, store and clock.
//
// A Run is used from one goroutine (the driver's, the simulation's
// scheduler); only a commit attempt's store callbacks may run on another
// (Env.Commit says which), and they touch nothing of the Run.
package targetrun

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Env is what a move into a node needs of its host. M is the host's
// message type. Participant i is the move's participant i+1 (0: the
// object the move names; SpotWide members follow). Calls that answer
// later do so by Run.Step, Run.Restored or the Commit's done, on the
// run's goroutine.
type Env[M any] interface {
	// Gone reports that the host can no longer run the move (its node is
	// down): nothing more is stepped.
	Gone() bool
	// Stepped is told every step, for tracing.
	Stepped(ev handoff.Event, effects []handoff.Effect)
	// Before is called before each effect runs.
	Before(e handoff.Effect)

	// Install stages participant i's incarnation with a temporary queue
	// that dispatches nothing (an error says why it could not).
	Install(i int) error

	// VerifySource's primitives (Run.verify decides). ReadSource and
	// After answer later, never within the call; the others may answer
	// at once.
	//
	// VerifyPeer checks that the prepare's source is still a live member
	// at the address the prepare came from.
	VerifyPeer(answer func(error))
	// ReadSource reads the object's record (location.ErrNotFound: none).
	ReadSource(answer func(location.Versioned, error))
	// ObjectGeneration is the object generation the prepare names.
	ObjectGeneration() uint64
	// Prechecked reports whether the source check before the seal found
	// the record that backs this move (PROTOCOL.md §5.2); if so it
	// answers that record later (never within the call), and VerifySource
	// neither checks the source's node nor reads again.
	Prechecked(answer func(location.Versioned)) bool
	// VerifyMembers judges the SpotWide members' records against the
	// Spot's record v (nil at once for a move without members).
	VerifyMembers(v location.Versioned, answer func(error))
	// TakeSlots takes the move's capacity slots on this node (nil at once
	// where slots are not bounded, or already taken).
	TakeSlots(answer func(error))
	// KeepVerified keeps the record that backs the move for the first
	// commit attempt (TakeVerified).
	KeepVerified(v location.Versioned)
	// After calls fn after d of the host's clock, with expired false; or,
	// if the move's restore deadline comes first, at the deadline with
	// expired true (handoff.VerifyPause decides which).
	After(d time.Duration, fn func(expired bool))

	SendCredit(receivedBytes uint64)
	SendFailed(e handoff.SendFailed)
	SendRelayReady()
	AckBoundary()
	SendOwnerCommitted()
	UpdateSessionRoutes()

	// Decode checks the verified payload against the move and returns the
	// saved work and pending timer ticks it carries, each naming its
	// participant (1-based) and its order; the host keeps what it restores
	// by Restore.
	Decode(stream []byte) ([]Work[M], error)
	// Restore restores participant i's state and timers on its own
	// goroutine, dispatching nothing; it answers by Run.Restored. An error:
	// it could not start.
	Restore(i int) error

	// PartOf names the participant of a relayed record's item, and its
	// message.
	PartOf(item any) (int, M)
	// JoinCallback is the Join callback the commit owes the object when
	// it made it a member of the prepare's User Spot (ok false: none);
	// IsJoinCallback recognizes one in the saved work.
	JoinCallback(c handoff.Committed) (m M, ok bool)
	IsJoinCallback(m M) bool
	// OpenMembers gives the SpotWide members (participants 1..) their
	// backlogs; it runs before the object's own queue opens.
	OpenMembers(backlogs [][]M)
	// Open switches participant 0's temporary queue to dispatch, backlog
	// first; relayed is how many of the backlog's last messages came by
	// relay. c is what the commit wrote.
	Open(backlog []M, relayed int, c handoff.Committed) error
	// Serving registers the opened object as the node's and serving.
	Serving()
	// ReleaseJoin lets the SpotWide User Spot a Join holds in place move
	// again (nothing when the move carries none, or it was released):
	// the joining Actor serves here and moves with its Spot from now
	// on, or the move ended. Held until the run ended, the hold would
	// outlive the Join its caller saw answered.
	ReleaseJoin()
	// Deliver posts a late relayed record to participant i.
	Deliver(i int, m M)
	// Remove ends participant i's staged incarnation; saved is the
	// restored saved work the move drops with it.
	Remove(i int, saved []M)
	StopIncarnation(i int)

	// CommitPlan composes one attempt of the owner commit.
	CommitPlan(settleOnly bool) *handoff.Commit
	// TakeVerified takes the record VerifySource read, once (ok false:
	// none kept). It may be called on the attempt's goroutine.
	TakeVerified() (location.Versioned, bool)
	// Commit runs attempt with a store whose calls end at c's deadline;
	// attempt ends by calling done exactly once, and the host feeds that
	// to Run.Answered on the run's goroutine.
	Commit(c *handoff.Commit, attempt func(st Store, done func(handoff.Event, handoff.Committed)))
	// JoinRefused: the commit goes on without the Join (the User Spot no
	// longer takes the Actor).
	JoinRefused(c *handoff.Commit)

	StartTimer(t handoff.StartTimer)
	StopTimer(t handoff.Timer)
	// StopTimers stops every timer of the run.
	StopTimers()
	Log(l handoff.Log)
	// Problem reports a primitive that failed (one event name each).
	Problem(i int, event string, err error, msg string)
	// Complete is the move's end on this node (err nil: committed).
	Complete(err error)
	// Forgotten: the machine dropped the run.
	Forgotten()
}

// Store is a Location Store for one commit attempt; every call answers
// once, by its callback.
type Store interface {
	Read(key location.AuthorityKey, answer func(location.Versioned, error))
	ReadAll(keys []location.AuthorityKey, answer func([]location.Versioned, error))
	CAS(op location.Op, answer func(error))
	Apply(ops []location.Op, answer func(error))
}

// Work is one item of a participant's restored backlog.
type Work[M any] struct {
	Participant uint32 // 1-based
	Order       uint64
	Msg         M
	What        string // for errors: "saved work", "a timer tick"
}

// Part is one participant's share of a move.
type Part[M any] struct {
	Saved []M // the restored saved work, in order, until the open
}

// Run is one move into a node.
type Run[M any] struct {
	m     *handoff.Target
	env   Env[M]
	Parts []*Part[M]
	// restoring counts participants whose restore has not answered.
	restoring int
	// committed is what the commit that applied wrote, for the open.
	committed handoff.Committed
	forgotten bool
}

// New builds the run of machine m with parts participants.
func New[M any](m *handoff.Target, env Env[M], parts int) *Run[M] {
	r := &Run[M]{m: m, env: env}
	for range parts {
		r.Parts = append(r.Parts, &Part[M]{})
	}
	return r
}

// Machine is the run's Target machine.
func (r *Run[M]) Machine() *handoff.Target { return r.m }

// Forgotten reports that the run was dropped.
func (r *Run[M]) Forgotten() bool { return r.forgotten }

// Step feeds ev and runs the effects.
func (r *Run[M]) Step(ev handoff.Event) {
	if r.forgotten || r.env.Gone() {
		return
	}
	effects := r.m.Step(ev)
	r.env.Stepped(ev, effects)
	r.Run(effects)
}

// Run runs effects (those of NewTarget, or of a step) in order; the
// events they produce at once are fed after all of them, in order, and
// the effects those produce run as the next round.
func (r *Run[M]) Run(effects []handoff.Effect) {
	for len(effects) > 0 {
		var next []handoff.Event
		for _, e := range effects {
			r.env.Before(e)
			if r.env.Gone() {
				return
			}
			if ev := r.effect(e); ev != nil {
				next = append(next, ev)
			}
		}
		effects = nil
		for _, ev := range next {
			more := r.m.Step(ev)
			r.env.Stepped(ev, more)
			effects = append(effects, more...)
		}
	}
}

// Restored is participant i's restore answering (err: it failed). The
// payload is restored once every participant's has.
func (r *Run[M]) Restored(i int, err error) {
	if err != nil {
		r.Step(handoff.RestoreFailed{Err: err})
		return
	}
	if r.restoring--; r.restoring == 0 {
		r.Step(handoff.Restored{})
	}
}

// Answered is a commit attempt's answer: c is what it found this move's
// commit wrote, kept for the open once ev says it committed.
func (r *Run[M]) Answered(ev handoff.Event, c handoff.Committed) {
	if _, ok := ev.(handoff.StoreCommitted); ok {
		// A later answer that found no membership keeps the one written.
		member := r.committed.Member
		r.committed = c
		if c.Member == nil {
			r.committed.Member = member
		}
	}
	r.Step(ev)
}

func (r *Run[M]) effect(e handoff.Effect) handoff.Event {
	env := r.env
	switch e := e.(type) {
	case handoff.InstallStaging:
		for i := range r.Parts {
			if err := env.Install(i); err != nil {
				return handoff.RestoreFailed{Err: err}
			}
		}

	case handoff.VerifySource:
		r.verify(0)

	case handoff.SendCredit:
		env.SendCredit(e.ReceivedBytes)

	case handoff.RestorePayload:
		return r.restore(e.Stream)

	case handoff.SendFailed:
		env.SendFailed(e)

	case handoff.SendRelayReady:
		env.SendRelayReady()

	case handoff.CommitOwner:
		r.commit(e.SettleOnly)

	case handoff.OpenDispatch:
		r.open(e.Relay)
		return handoff.DispatchOpened{}

	case handoff.DeliverLate:
		i, m := env.PartOf(e.Item)
		env.Deliver(i, m)

	case handoff.UpdateSessionRoutes:
		env.UpdateSessionRoutes()

	case handoff.AckBoundary:
		env.AckBoundary()

	case handoff.RemoveTarget:
		// The restored saved work goes with the staged incarnation: the
		// source's payload is the copy left, if it still holds it.
		for i, p := range r.Parts {
			env.Remove(i, p.Saved)
			p.Saved = nil
		}

	case handoff.StopIncarnation:
		for i := range r.Parts {
			env.StopIncarnation(i)
		}

	case handoff.Forget:
		r.forgotten = true
		env.StopTimers()
		env.Forgotten()

	case handoff.StartTimer:
		env.StartTimer(e)

	case handoff.StopTimer:
		env.StopTimer(e.Timer)

	case handoff.Log:
		env.Log(e)

	case handoff.Complete:
		env.ReleaseJoin()
		env.Complete(e.Err)

	default:
		panic(fmt.Sprintf("targetrun: unknown target effect %T", e))
	}
	return nil
}

// verify runs one try of VerifySource (PROTOCOL.md §5.7): the prepare's
// source must still be a live member, the object's record must name it at
// the move's fence (and the SpotWide members' records their Spot), and
// the move's capacity slots are taken before relay-ready. A try that
// learned nothing of the source is tried again as handoff.VerifyAgain
// paces it (prev: the last pause), until the restore deadline; a run
// that ended stops trying.
func (r *Run[M]) verify(prev time.Duration) {
	env, id := r.env, r.m.Identity()
	ended := func() bool { return r.forgotten || env.Gone() || r.m.Finished() }
	answer := func(err error, peer bool) {
		again, wait := handoff.VerifyAgain(err, peer, prev)
		if !again {
			r.Step(handoff.SourceVerified{Err: err})
			return
		}
		env.After(wait, func(expired bool) {
			switch {
			case ended():
			case expired:
				r.Step(handoff.SourceVerified{Err: err, Unsettled: true})
			default:
				r.verify(wait)
			}
		})
	}
	if prev == 0 && env.Prechecked(func(v location.Versioned) {
		if !ended() {
			r.verified(v, answer)
		}
	}) {
		return
	}
	env.VerifyPeer(func(err error) {
		switch {
		case ended():
		case err != nil:
			answer(err, true)
		default:
			env.ReadSource(func(v location.Versioned, err error) {
				switch {
				case ended():
				case errors.Is(err, location.ErrNotFound):
					answer(id.JudgeSource(handoff.RecordView{}, env.ObjectGeneration()), false)
				case err != nil:
					answer(err, false)
				default:
					r.verified(v, answer)
				}
			})
		}
	})
}

// verified goes on with the record v read for VerifySource.
func (r *Run[M]) verified(v location.Versioned, answer func(err error, peer bool)) {
	env, id := r.env, r.m.Identity()
	if err := id.JudgeSource(handoff.ViewOf(v), env.ObjectGeneration()); err != nil {
		answer(err, false)
		return
	}
	env.VerifyMembers(v, func(err error) {
		if err != nil {
			answer(err, false)
			return
		}
		env.TakeSlots(func(err error) {
			if err == nil {
				env.KeepVerified(v)
			}
			answer(err, false)
		})
	})
}

// restore decodes the verified payload, gives each participant its saved
// work and pending ticks in their order, and restores every participant
// on its own goroutine, dispatching nothing (PROTOCOL.md §5.7).
func (r *Run[M]) restore(stream []byte) handoff.Event {
	work, err := r.env.Decode(stream)
	if err != nil {
		return handoff.RestoreFailed{Err: err}
	}
	parts := len(r.Parts)
	backlogs := make([][]Work[M], parts)
	for _, w := range work {
		if w.Participant < 1 || int(w.Participant) > parts {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: %s of participant %d, the move has %d", roamerr.ErrConflict, w.What, w.Participant, parts)}
		}
		backlogs[w.Participant-1] = append(backlogs[w.Participant-1], w)
	}
	for i, b := range backlogs {
		sort.SliceStable(b, func(x, y int) bool { return b[x].Order < b[y].Order })
		saved := make([]M, len(b))
		for j, w := range b {
			saved[j] = w.Msg
		}
		r.Parts[i].Saved = saved
	}
	r.restoring = parts
	for i := range r.Parts {
		if err := r.env.Restore(i); err != nil {
			return handoff.RestoreFailed{Err: err}
		}
	}
	return nil
}

// open gives every participant its backlog — its saved work, then its
// share of the relay — and opens dispatch: the members first (the host
// orders them after the Spot's callback), then the object. The Join
// callback of the commit runs after the commit, before what moved with
// the Actor (PROTOCOL.md §7.10), but after the callback of an earlier
// Join the Actor had not handled when the move sealed it: callbacks keep
// their commits' order.
func (r *Run[M]) open(relay []any) {
	env := r.env
	backlogs := make([][]M, len(r.Parts))
	for i, p := range r.Parts {
		backlogs[i] = p.Saved
		p.Saved = nil
	}
	saved := len(backlogs[0])
	relayed := 0
	for _, item := range relay {
		i, m := env.PartOf(item)
		backlogs[i] = append(backlogs[i], m)
		if i == 0 {
			relayed++
		}
	}
	if j, ok := env.JoinCallback(r.committed); ok {
		at := 0
		for i, m := range backlogs[0][:saved] {
			if env.IsJoinCallback(m) {
				at = i + 1
			}
		}
		b := append(backlogs[0][:at:at], j)
		backlogs[0] = append(b, backlogs[0][at:]...)
	}
	env.OpenMembers(backlogs[1:])
	if err := env.Open(backlogs[0], relayed, r.committed); err != nil {
		env.Problem(0, "open_failed", err, "opening dispatch failed")
	}
	env.Serving()
	env.ReleaseJoin()
	env.SendOwnerCommitted()
}

// commit runs one attempt of the target-only CAS (PROTOCOL.md §5.11;
// handoff.Commit decides): a consistent read judged, then either the
// settling fence-out of the move, or the owner change with whatever
// other records its transaction needs read first. The attempt runs on the
// host's store goroutine and touches only the Commit and the Env.
func (r *Run[M]) commit(settleOnly bool) {
	env := r.env
	c := env.CommitPlan(settleOnly)
	env.Commit(c, func(st Store, done func(handoff.Event, handoff.Committed)) {
		judged := func(v location.Versioned) {
			if ev, got := c.Read(v); ev != nil {
				done(ev, got)
				return
			}
			if c.SettleOnly {
				// A conflict may show the earlier CAS applied after the read.
				st.CAS(c.FenceOut(v), func(err error) {
					done(c.Answer(err, handoff.StoreNotCommitted{}, handoff.Committed{}))
				})
				return
			}
			txn := c.Txn(v)
			var compose func()
			compose = func() {
				keys := txn.Needs()
				if len(keys) > 0 {
					st.ReadAll(keys, func(vs []location.Versioned, err error) {
						if err != nil {
							done(txn.ReadFailed(err), handoff.Committed{})
							return
						}
						if ev := txn.Read(vs); ev != nil {
							done(ev, handoff.Committed{})
							return
						}
						compose()
					})
					return
				}
				if txn.JoinRefused() {
					env.JoinRefused(c)
				}
				ops, wrote := txn.Ops()
				answer := func(err error) { done(c.Answer(err, handoff.StoreCommitted{}, wrote)) }
				if len(ops) == 1 {
					st.CAS(ops[0], answer)
				} else {
					st.Apply(ops, answer)
				}
			}
			compose()
		}
		if v, ok := env.TakeVerified(); ok && c.ReusesVerified() {
			judged(v) // one store round trip less per move
			return
		}
		st.Read(c.Key, func(v location.Versioned, err error) {
			switch {
			case errors.Is(err, location.ErrNotFound):
				done(c.ReadMissing(), handoff.Committed{})
			case err != nil:
				done(handoff.StoreRetryable{Err: err}, handoff.Committed{})
			default:
				judged(v)
			}
		})
	})
}
