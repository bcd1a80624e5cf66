package spotsim

import (
	"context"
	"crypto/sha256"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Runner drives one machine of package activation the way run.go's runner
// does: it runs each effect of a step in order, each to its end (a store
// call, a lock wait) before the next, feeds the answers back in order,
// and only when no answer is left waits for the machine's next timer; a
// timer that fires meanwhile waits its turn. Store calls run under the
// runner's context deadline, except those run.go gives a timeout of their
// own (an abort, a root deletion).
type Runner struct {
	w        *World
	life     *Life
	label    string // what it runs, for its name
	op       string // the operation it runs for, if any
	spot     *Spot
	step     func(activation.Event) []activation.Effect
	deadline time.Duration // the context's deadline (0: none)

	effects []activation.Effect
	idx     int
	queue   []activation.Event
	waiting bool // idle, waiting for a timer
	// executing: exec is running an effect; an answer that comes at once
	// is queued, not stepped (no re-entry).
	executing, answeredNow bool
	timers                 [4]rtimer
	fired                  []activation.Timer

	// What a SpotActivation brings.
	env   *messages.SpotActivation
	first *Msg

	staged *Inc
	// commit: the generation staged, and whether its Ready commit was sent.
	commitGen, commitOwnerGen uint64
	commitSent                bool
	resumed                   string // the operation whose root this machine read back
	orig                      *Msg   // and its first message
	opened                    bool
	capacity                  bool
	locked                    bool
	// cpAsked: it claimed the Spot's checkpoint; cpExpected is the state
	// of the last checkpoint the store had accepted then (what the
	// incarnation must start from), cpClaimNo the claims counted after
	// its own (the checker's, check.go).
	cpAsked    bool
	cpExpected []*Msg
	cpClaimNo  int

	done, dead bool
	err        error
	onDone     func(error)
	kind       string // "activation", "recovery", "clear", "release", "write"
	act        *activation.Activation
}

type rtimer struct {
	seq     uint64
	running bool
}

func (l *Life) newRunner(kind string, s *Spot, deadline time.Duration, step func(activation.Event) []activation.Effect, onDone func(error)) *Runner {
	w := l.w
	r := &Runner{w: w, life: l, label: kind, spot: s, step: step, deadline: deadline, onDone: onDone, kind: kind}
	l.runners = append(l.runners, r)
	w.runners = append(w.runners, r)
	return r
}

// String names the runner: lifecycle, machine, Spot and operation.
func (r *Runner) String() string {
	s := r.life.rid + ":" + r.label + ":" + r.spot.id
	if r.op != "" {
		s += ":" + r.op
	}
	return s
}

func (r *Runner) run(effects []activation.Effect) {
	if r.w.Tracing() {
		r.w.tracef("%s starts %s", r, effectsString(effects))
	}
	r.effects, r.idx = effects, 0
	r.advance()
}

// advance runs effects until one must wait, then the next answer, then a
// fired timer.
func (r *Runner) advance() {
	w := r.w
	for !r.dead {
		if r.idx < len(r.effects) {
			e := r.effects[r.idx]
			r.idx++
			if w.hooks.Effect != nil {
				w.hooks.Effect(w, r, e)
				if r.dead {
					return
				}
			}
			w.beforeEffect(r, e)
			r.executing, r.answeredNow = true, false
			wait := r.exec(e)
			r.executing = false
			if wait && !r.answeredNow && !r.dead {
				return // resumed by the effect's completion
			}
			continue
		}
		if r.done {
			r.close()
			return
		}
		var ev activation.Event
		switch {
		case len(r.queue) > 0:
			ev, r.queue = r.queue[0], r.queue[1:]
		case len(r.fired) > 0:
			t := r.fired[0]
			r.fired = r.fired[1:]
			ev = activation.TimerFired{Timer: t, Now: w.wall(w.Now())}
		default:
			if !r.timerRunning() {
				// A machine defect: no answer and no timer to wait for.
				v := w.violate("machine-stalled", "%s waits for nothing", r)
				v.Obj = r.spot.id
				r.close()
				return
			}
			r.waiting = true
			return
		}
		r.effects, r.idx = r.step(ev), 0
		if w.Tracing() {
			w.tracef("%s ← %s → %s", r, eventString(ev), effectsString(r.effects))
		}
	}
}

// resume continues after an effect that had to wait, with its answer if
// it has one.
func (r *Runner) resume(ev activation.Event) {
	if r.dead {
		return
	}
	if ev != nil {
		r.queue = append(r.queue, ev)
	}
	if r.executing {
		r.answeredNow = true
		return
	}
	r.advance()
}

func (r *Runner) timerRunning() bool {
	for _, t := range r.timers {
		if t.running {
			return true
		}
	}
	return false
}

func (r *Runner) startTimer(t activation.Timer, at time.Duration) {
	r.stopTimer(t)
	tm := &r.timers[t]
	tm.running = true
	seq := tm.seq
	r.w.at(at, func() {
		if r.dead || r.done || tm.seq != seq || !tm.running {
			return
		}
		tm.running = false
		r.fired = append(r.fired, t)
		if r.waiting {
			r.waiting = false
			r.advance()
		}
	})
}

func (r *Runner) stopTimer(t activation.Timer) {
	tm := &r.timers[t]
	tm.seq++
	tm.running = false
	for i, f := range r.fired {
		if f == t {
			r.fired = append(r.fired[:i], r.fired[i+1:]...)
			break
		}
	}
}

// close gives back what a machine that ended still held (run.go close).
func (r *Runner) close() {
	r.done = true
	for t := range r.timers {
		r.stopTimer(activation.Timer(t))
	}
	r.fired = nil
	if r.capacity {
		r.capacity = false
		r.life.pending--
	}
	if r.locked {
		r.life.unlock(r.spot)
		r.locked = false
	}
	if m := r.orig; m != nil && !r.opened && m.open() && m.at == r.life && m != r.first {
		// The resume ended without opening: its copy of the resumed first
		// message is dropped; the root (if still there) keeps it.
		m.at = nil
		if r.w.store.roots["activation-"+m.op] == nil {
			r.w.lostMsg(m, lossRoot, "the resume of its activation by "+r.String()+" ended without opening, and its root is gone")
		}
	}
	if r.w.Tracing() {
		r.w.tracef("%s ends: %s", r, errString(r.err))
	}
	if r.onDone != nil {
		r.onDone(r.err)
	}
}

func addrOf(l *Life) string { return fmt.Sprintf("addr:%d", l.addr) }

func (w *World) lifeByAddress(a string) *Life {
	var n int
	if _, err := fmt.Sscanf(a, "addr:%d", &n); err != nil {
		return nil
	}
	return w.lifeByAddr(n)
}

// exec runs one effect; it reports whether the runner waits for its
// completion (then resume continues).
func (r *Runner) exec(e activation.Effect) bool {
	w, l, s := r.w, r.life, r.spot
	now := w.wall(w.Now())
	switch e := e.(type) {
	case activation.LockKey:
		if w.cfg.Sabotage == SabotageNoIDQueue {
			r.queue = append(r.queue, activation.KeyLocked{Now: now})
			return false
		}
		l.lock(s, func() {
			r.locked = true
			r.resume(activation.KeyLocked{Now: w.wall(w.Now())})
		})
		return true
	case activation.UnlockKey:
		if r.locked {
			r.locked = false
			l.unlock(s)
		}
	case activation.ReadAuthority:
		l.readAuthority(s, r.deadline, func(a authority, err error) {
			auth := activation.Authority{Versioned: a.v, OwnerEnded: a.ended}
			if a.address != nil {
				auth.Address = addrOf(a.address)
			}
			if err == nil && a.v.Present() && !a.ended && activation.SameOwner(a.v.Record.GetOwner(), l.owner) {
				auth.Hosted = l.hosts(s, a.v.Record.GetObjectGeneration())
			}
			r.resume(activation.AuthorityRead{Authority: auth, Err: err, Now: w.wall(w.Now())})
		})
		return true
	case activation.Watch:
		l.watch(e.Key, e.After, r.deadline, func(err error) {
			r.resume(activation.Watched{Err: err, Now: w.wall(w.Now())})
		})
		return true
	case activation.AdmitCapacity:
		err := l.admitCapacity()
		if err == nil && l.node.capacity != 0 {
			r.capacity = true // a bounded node holds a pending slot until released
		}
		r.queue = append(r.queue, activation.CapacityAdmitted{Err: err})
	case activation.ReleaseCapacity:
		if r.capacity {
			r.capacity = false
			l.pending--
		}
	case activation.PutRoot:
		rt := &root{ref: rootRef(e.RootKey, r.first), op: r.env.GetOperationId(), first: r.first}
		w.store.call(l, storeOp{kind: opPutRoot, rootKey: e.RootKey, root: rt, why: e.RootKey}, r.deadline, func(res storeRes) {
			r.resume(activation.RootPut{Ref: rt.ref, Err: res.err})
		})
		return true
	case activation.GetRoot:
		w.store.call(l, storeOp{kind: opGetRoot, rootKey: e.RootKey, why: e.RootKey}, r.deadline, func(res storeRes) {
			got := activation.RootGot{Err: res.err}
			if res.err == nil {
				got.Ref, got.Operation, got.First = res.root.ref, res.root.op, res.root.first
				w.place(res.root.first, l) // the resumer holds a copy now
				r.resumed, r.orig = res.root.op, res.root.first
			}
			r.resume(got)
		})
		return true
	case activation.Reserve:
		op := location.CreateOp(e.Key, e.Record)
		if e.Expected != 0 {
			op = location.UpdateOp(e.Key, e.Expected, e.Record)
		}
		r.apply([]location.Op{op, location.CheckOp(location.Key(e.Other, e.Key.ID), 0)}, "reserve", r.deadline, func(res storeRes) {
			ans := activation.WriteAnswered{Err: res.err, Now: w.wall(w.Now())}
			if res.err == nil {
				ans.Version = res.versions[0]
			}
			r.resume(ans)
		})
		return true
	case activation.CompareAndSet:
		op := location.UpdateOp(e.Key, e.Expected, e.Record)
		if e.Expected == 0 {
			op = location.CreateOp(e.Key, e.Record)
		}
		if r.act != nil && r.act.Phase() == activation.Committing {
			r.commitSent = true
		}
		dl := r.deadline
		if e.Settle {
			dl = w.Now() + w.cfg.CallTimeout // run.go storeCtx: a timeout of its own
		}
		r.apply([]location.Op{op}, "cas "+stateName(e.Record), dl, func(res storeRes) {
			ans := activation.WriteAnswered{Err: res.err, Now: w.wall(w.Now())}
			if res.err == nil {
				ans.Version = res.versions[0]
			}
			r.resume(ans)
		})
		return true
	case activation.ReadRecord:
		dl := r.deadline
		if e.Settle {
			dl = w.Now() + w.cfg.CallTimeout // run.go storeCtx: a timeout of its own
		}
		w.store.call(l, storeOp{kind: opRead, key: e.Key, why: "record " + e.Key.ID}, dl, func(res storeRes) {
			v := res.v
			if res.err != nil {
				v = location.Versioned{Key: e.Key}
			}
			r.resume(activation.RecordRead{Record: v, Err: res.err, Now: w.wall(w.Now())})
		})
		return true
	case activation.AbortReservation:
		if r.resumed != "" {
			w.takeoversReleased = append(w.takeoversReleased, s)
		}
		r.apply([]location.Op{location.DeleteOp(e.Key, e.Version)}, "abort", w.Now()+w.cfg.CallTimeout, func(res storeRes) {
			r.resume(activation.AbortAnswered{Err: res.err})
		})
		return true
	case activation.Delete:
		r.apply([]location.Op{location.DeleteOp(e.Key, e.Version)}, "delete", r.deadline, func(res storeRes) {
			r.resume(activation.Deleted{Err: res.err, Now: w.wall(w.Now())})
		})
		return true
	case activation.DeleteRoot:
		w.store.call(l, storeOp{kind: opDeleteRoot, rootKey: e.RootKey, holder: r.first, why: e.RootKey}, w.Now()+w.cfg.CallTimeout, func(storeRes) {
			r.resume(nil)
		})
		return true
	case activation.ReadOwner:
		l.ownerAlive(e.Owner, r.deadline, func(alive bool, err error) {
			r.resume(activation.OwnerRead{Alive: alive, Err: err})
		})
		return true
	case activation.ClaimCheckpoint:
		r.cpAsked, r.cpExpected = true, w.lastCheckpointState(s)
		failed := !w.over && w.chance(w.faults.PStageFail)
		if mode, _, ok := w.checkpointFault(l, opCheckpointClaim, s); ok && mode != modeOK {
			failed = true
		}
		if failed && w.cfg.Sabotage == SabotageClaimFailStartsEmpty {
			r.cpClaimNo = s.cpClaims
			r.queue = append(r.queue, activation.CheckpointClaimed{})
			break
		}
		if failed {
			r.queue = append(r.queue, activation.CheckpointClaimed{Err: fmt.Errorf("%w: claim: the store did not answer", roamerr.ErrUnavailable)})
			break
		}
		state, restore := w.claim(s, e.Generation, e.OwnerGeneration)
		r.cpClaimNo = s.cpClaims
		r.queue = append(r.queue, activation.CheckpointClaimed{State: state, Restore: restore})
	case activation.Stage:
		var err error
		if !w.over && w.chance(w.faults.PStageFail) {
			err = fmt.Errorf("%w: stage %s: spawn failed", roamerr.ErrUnavailable, e.Key.ID)
		} else {
			r.staged, err = l.stage(s, e.Generation, e.OwnerGeneration)
			r.commitGen, r.commitOwnerGen, r.commitSent = e.Generation, e.OwnerGeneration, false
			if err != nil {
				err = fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
			} else {
				r.staged.cpAsked, r.staged.cpExpected, r.staged.cpClaimNo = r.cpAsked, r.cpExpected, r.cpClaimNo
				if e.Restore {
					w.restore(r.staged, e.State)
				}
			}
		}
		r.queue = append(r.queue, activation.Staged{Err: err})
	case activation.DiscardStaged:
		if r.commitSent {
			w.discardedCommits = append(w.discardedCommits, incName{spot: s, gen: r.commitGen, ownerGen: r.commitOwnerGen})
		}
		if r.staged != nil {
			w.discard(r.staged)
			r.staged = nil
		}
	case activation.Open:
		if l.ended {
			// Staged.Open refuses on an ended lifecycle.
			r.queue = append(r.queue, activation.Opened{Err: fmt.Errorf("%w: open: the node's owner lease ended", roamerr.ErrUnavailable)})
			break
		}
		inc := r.staged
		r.staged, r.opened = nil, true
		first := make([]*Msg, len(e.Messages))
		for i, m := range e.Messages {
			first[i] = m.(*Msg)
		}
		key, op, rootKey, committed := e.Key, e.FirstOperation, e.RootKey, e.Committed
		inc.resumedFrom = r.resumed
		w.open(inc, first, op, func(settled func()) { l.clearRecovery(s, key, op, rootKey, committed, settled) })
		r.queue = append(r.queue, activation.Opened{})
	case activation.Forward:
		to := w.lifeByAddress(e.Address)
		pid := pidKey{spot: s.id, gen: e.Record.GetObjectGeneration(), ownerGen: e.Record.GetAuthorityOwnerGeneration()}
		if w.Tracing() {
			w.tracef("%s forwards m%d → %s on %s", r, r.first.id, pid, to)
		}
		if to == nil {
			w.lostMsg(r.first, lossTransit, "forwarded to an unknown address")
			break
		}
		l.send(to, &packet{kind: pApp, msg: r.first, pid: pid})
	case activation.PassOn:
		l.passOn(r.env, r.first, r.deadline, func(ok bool) { r.resume(activation.PassedOn{OK: ok}) })
		return true
	case activation.RespondFailure:
		w.checkClass(r.String()+" answers", e.Err)
		if r.first != nil {
			c := code(e.Err)
			w.answerFailure(l, r.first, failure{code: c, definite: c != roamerr.CodeDeadlineExceeded, why: "activation failed: " + e.Err.Error()})
		}
	case activation.CloseLocal:
		answered := false
		answer := func(err error) {
			if !answered {
				answered = true
				r.resume(activation.LocalClosed{Err: err})
			}
		}
		w.closeLocal(l, s, e.Generation, answer)
		if !answered && r.deadline > 0 {
			w.at(r.deadline, func() {
				answer(fmt.Errorf("%w: accepted turns still running: %w", roamerr.ErrDeadlineExceeded, context.DeadlineExceeded))
			})
		}
		return true
	case activation.DropRoute:
		l.dropRoute(s)
	case activation.StartTimer:
		at := w.Now() + e.After
		if !e.At.IsZero() {
			at = w.logical(e.At)
		}
		r.startTimer(e.Timer, at)
	case activation.StopTimer:
		r.stopTimer(e.Timer)
	case activation.Log:
		w.logged(r, e)
	case activation.Measure:
		switch {
		case e.Activated:
			w.stats.Activated++
		case e.Outcome == "forwarded":
			w.stats.Forwarded++
		}
	case activation.Finish:
		w.checkClass(r.String()+" finishes", e.Err)
		r.done, r.err = true, e.Err
	default:
		panic(fmt.Sprintf("sim: no driver for effect %T", e))
	}
	return false
}

// apply runs a transaction of this lifecycle (its lease check added by
// the store), answering only while the runner lives.
func (r *Runner) apply(ops []location.Op, why string, deadline time.Duration, done func(storeRes)) {
	r.w.store.call(r.life, storeOp{kind: opApply, key: ops[0].Key, ops: ops, why: why + " " + ops[0].Key.ID}, deadline, done)
}

// rootRef is a root's reference: its key and a digest of its content.
func rootRef(key string, first *Msg) location.RootRef {
	return location.RootRef{Key: key, SHA256: sha256.Sum256([]byte(key)), Size: uint64(64 + first.id%7)}
}

// logged counts a machine's log lines (and traces them).
func (w *World) logged(r *Runner, l activation.Log) {
	switch l.Event {
	case "activation_resumed":
		w.stats.Resumed++
	case "reactivation_refused":
		w.stats.RefusedPreserved++
	case "spot_reactivated":
		w.stats.ReactivatedEmpty++
	case "activation_recovery_clear_failed":
		w.stats.ClearGaveUp++
	case "activation_failed":
		w.stats.ActivationFailed++
		if r.first != nil && !r.first.request {
			// A send has nobody to answer: the log line and the counter
			// are its loud failure (RespondFailure above recorded it).
		}
	}
	if w.Tracing() {
		msg := l.Event
		if l.Err != nil {
			msg += ": " + l.Err.Error()
		}
		w.tracef("%s log %s", r, msg)
	}
}

func stateName(rec *location.Record) string {
	switch rec.GetState() {
	case messages.LifecycleState_LIFECYCLE_STATE_CREATING:
		return "Creating"
	case messages.LifecycleState_LIFECYCLE_STATE_READY:
		if rec.GetActivationRecovery() == nil {
			return "Ready(no pointer)"
		}
		return "Ready"
	case messages.LifecycleState_LIFECYCLE_STATE_CLOSING:
		return "Closing"
	}
	return "?"
}

// ---- trace formatting ----

func eventString(ev activation.Event) string {
	switch ev := ev.(type) {
	case activation.AuthorityRead:
		if ev.Err != nil {
			return "AuthorityRead(" + errString(ev.Err) + ")"
		}
		s := "AuthorityRead(" + recString(ev.Authority.Versioned)
		if ev.Authority.OwnerEnded {
			s += " ended"
		}
		if ev.Authority.Hosted {
			s += " hosted"
		}
		return s + ")"
	case activation.WriteAnswered:
		if ev.Err != nil {
			return "WriteAnswered(" + errString(ev.Err) + ")"
		}
		return fmt.Sprintf("WriteAnswered(v%d)", ev.Version)
	case activation.RecordRead:
		if ev.Err != nil {
			return "RecordRead(" + errString(ev.Err) + ")"
		}
		return "RecordRead(" + recString(ev.Record) + ")"
	case activation.TimerFired:
		return "Timer(" + ev.Timer.String() + ")"
	case activation.RootGot:
		if ev.Err != nil {
			return "RootGot(" + errString(ev.Err) + ")"
		}
		return "RootGot(" + ev.Operation + ")"
	case activation.OwnerRead:
		if ev.Err != nil {
			return "OwnerRead(" + errString(ev.Err) + ")"
		}
		return fmt.Sprintf("OwnerRead(alive=%v)", ev.Alive)
	case activation.PassedOn:
		return fmt.Sprintf("PassedOn(%v)", ev.OK)
	}
	s := reflect.TypeOf(ev).Name()
	if err := eventErr(ev); err != nil {
		s += "(" + errString(err) + ")"
	}
	return s
}

func eventErr(ev activation.Event) error {
	switch ev := ev.(type) {
	case activation.Watched:
		return ev.Err
	case activation.CapacityAdmitted:
		return ev.Err
	case activation.RootPut:
		return ev.Err
	case activation.Staged:
		return ev.Err
	case activation.Opened:
		return ev.Err
	case activation.AbortAnswered:
		return ev.Err
	case activation.Deleted:
		return ev.Err
	case activation.LocalClosed:
		return ev.Err
	}
	return nil
}

func effectsString(effects []activation.Effect) string {
	parts := make([]string, 0, len(effects))
	for _, e := range effects {
		switch e := e.(type) {
		case activation.StartTimer:
			parts = append(parts, "StartTimer("+e.Timer.String()+")")
		case activation.StopTimer:
			parts = append(parts, "StopTimer("+e.Timer.String()+")")
		case activation.Log:
			parts = append(parts, "Log("+e.Event+")")
		case activation.Finish:
			if e.Err != nil {
				parts = append(parts, "Finish("+code(e.Err)+")")
			} else {
				parts = append(parts, "Finish")
			}
		case activation.CompareAndSet:
			parts = append(parts, fmt.Sprintf("CompareAndSet(v%d %s)", e.Expected, stateName(e.Record)))
		case activation.Reserve:
			parts = append(parts, fmt.Sprintf("Reserve(v%d)", e.Expected))
		case activation.Measure:
		default:
			parts = append(parts, reflect.TypeOf(e).Name())
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}
