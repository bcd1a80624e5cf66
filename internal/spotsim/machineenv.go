package spotsim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/activationrun"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Runner hosts one machine of package activation on a lifecycle: the
// driver's own interpreter (activationrun) orders its effects, answers,
// timers and deadlines; Runner supplies this world's primitives (the
// simulated store, the lifecycle's locks and incarnations, the network,
// the scheduler's timers) and the checks that see them.
type Runner struct {
	w        *World
	life     *Life
	label    string // what it runs, for its name
	op       string // the operation it runs for, if any
	spot     *Spot
	deadline time.Duration // the context's deadline (0: none)
	ar       *activationrun.Runner

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

var _ activationrun.Env = (*Runner)(nil)

func (l *Life) newRunner(kind string, s *Spot, deadline time.Duration, step func(activation.Event) []activation.Effect, onDone func(error)) *Runner {
	w := l.w
	r := &Runner{w: w, life: l, label: kind, spot: s, deadline: deadline, onDone: onDone, kind: kind}
	r.ar = activationrun.New(step, r)
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

func (r *Runner) run(effects []activation.Effect) { r.ar.Start(effects) }

// dl is the simulated deadline of a call: the operation's, or the
// driver's DefaultTimeout from now.
func (r *Runner) dl(d activationrun.Deadline) time.Duration {
	if d == activationrun.OwnTimeout {
		return r.w.Now() + r.w.cfg.CallTimeout
	}
	return r.deadline
}

func (r *Runner) answer(ev activation.Event) { r.ar.Answer(ev) }

func (r *Runner) Gone() bool { return r.dead }

func (r *Runner) Now() time.Time { return r.w.wall(r.w.Now()) }

func (r *Runner) Stepped(ev activation.Event, effects []activation.Effect) {
	w := r.w
	if !w.Tracing() {
		return
	}
	if ev == nil {
		w.tracef("%s starts %s", r, effectsString(effects))
		return
	}
	w.tracef("%s ← %s → %s", r, eventString(ev), effectsString(effects))
}

func (r *Runner) Before(e activation.Effect) {
	w := r.w
	if w.hooks.Effect != nil {
		w.hooks.Effect(w, r, e)
		if r.dead {
			return
		}
	}
	w.beforeEffect(r, e)
	if f, ok := e.(activation.Finish); ok {
		w.checkClass(r.String()+" finishes", f.Err)
	}
}

func (r *Runner) Lock(string) {
	w, l := r.w, r.life
	if w.cfg.Sabotage == SabotageNoIDQueue {
		r.answer(activation.KeyLocked{Now: r.Now()})
		return
	}
	l.lock(r.spot, func() {
		r.locked = true
		r.answer(activation.KeyLocked{Now: r.Now()})
	})
}

func (r *Runner) Unlock() {
	if r.locked {
		r.locked = false
		r.life.unlock(r.spot)
	}
}

func (r *Runner) ReadAuthority(_ string, d activationrun.Deadline) {
	w, l, s := r.w, r.life, r.spot
	l.readAuthority(s, r.dl(d), func(a authority, err error) {
		auth := activation.Authority{Versioned: a.v, OwnerEnded: a.ended}
		if a.address != nil {
			auth.Address = addrOf(a.address)
		}
		if err == nil && a.v.Present() && !a.ended && activation.SameOwner(a.v.Record.GetOwner(), l.owner) {
			auth.Hosted = l.hosts(s, a.v.Record.GetObjectGeneration())
		}
		r.answer(activation.AuthorityRead{Authority: auth, Err: err, Now: w.wall(w.Now())})
	})
}

func (r *Runner) Watch(key location.AuthorityKey, after location.StoreVersion, d activationrun.Deadline) {
	r.life.watch(key, after, r.dl(d), func(err error) {
		r.answer(activation.Watched{Err: err, Now: r.Now()})
	})
}

func (r *Runner) AdmitCapacity(activationrun.Deadline) {
	l := r.life
	holds, err := l.admitCapacity()
	r.capacity = r.capacity || holds
	r.answer(activation.CapacityAdmitted{Err: err})
}

func (r *Runner) ReleaseCapacity() {
	if r.capacity {
		r.capacity = false
		r.life.pending--
	}
}

func (r *Runner) PutRoot(rootKey string, d activationrun.Deadline) {
	rt := &root{ref: rootRef(rootKey, r.first), op: r.env.GetOperationId(), first: r.first}
	r.w.store.call(r.life, storeOp{kind: opPutRoot, rootKey: rootKey, root: rt, why: rootKey}, r.dl(d), func(res storeRes) {
		r.answer(activation.RootPut{Ref: rt.ref, Err: res.err})
	})
}

func (r *Runner) GetRoot(rootKey string, d activationrun.Deadline) {
	w, l := r.w, r.life
	w.store.call(l, storeOp{kind: opGetRoot, rootKey: rootKey, why: rootKey}, r.dl(d), func(res storeRes) {
		got := activation.RootGot{Err: res.err}
		if res.err == nil {
			got.Ref, got.Operation, got.First = res.root.ref, res.root.op, res.root.first
			w.place(res.root.first, l) // the resumer holds a copy now
			r.resumed, r.orig = res.root.op, res.root.first
		}
		r.answer(got)
	})
}

func (r *Runner) writeAnswer(res storeRes) {
	ans := activation.WriteAnswered{Err: res.err, Now: r.Now()}
	if res.err == nil {
		ans.Version = res.versions[0]
	}
	r.answer(ans)
}

func (r *Runner) Reserve(e activation.Reserve, d activationrun.Deadline) {
	op := location.CreateOp(e.Key, e.Record)
	if e.Expected != 0 {
		op = location.UpdateOp(e.Key, e.Expected, e.Record)
	}
	ops := []location.Op{op, location.CheckOp(location.Key(e.Other, e.Key.ID), 0)}
	if e.NoCheckpoint && r.w.cfg.Sabotage != SabotageReserveSkipsCheckpointCheck {
		ops = append(ops, location.CheckNoCheckpointOp(e.Key))
	}
	r.apply(ops, "reserve", r.dl(d), func(res storeRes) {
		var c *location.ConflictError
		if e.NoCheckpoint && errors.As(res.err, &c) && slices.Equal(c.FailedOps, []int{2}) {
			r.answer(activation.WriteAnswered{Err: res.err, Now: r.Now(), CheckpointStored: true})
			return
		}
		r.writeAnswer(res)
	})
}

func (r *Runner) CompareAndSet(e activation.CompareAndSet, d activationrun.Deadline) {
	op := location.UpdateOp(e.Key, e.Expected, e.Record)
	if e.Expected == 0 {
		op = location.CreateOp(e.Key, e.Record)
	}
	if r.act != nil && r.act.Phase() == activation.Committing {
		r.commitSent = true
	}
	ops := []location.Op{op}
	if e.DeleteRoot != "" {
		ops = append(ops, location.DeleteRootOp(e.DeleteRoot))
	}
	r.apply(ops, "cas "+stateName(e.Record), r.dl(d), r.writeAnswer)
}

func (r *Runner) ReadRecord(key location.AuthorityKey, d activationrun.Deadline) {
	r.w.store.call(r.life, storeOp{kind: opRead, key: key, why: "record " + key.ID}, r.dl(d), func(res storeRes) {
		v := res.v
		if res.err != nil {
			v = location.Versioned{Key: key}
		}
		r.answer(activation.RecordRead{Record: v, Err: res.err, Now: r.Now()})
	})
}

func (r *Runner) AbortReservation(e activation.AbortReservation, d activationrun.Deadline) {
	if r.resumed != "" {
		r.w.takeoversReleased = append(r.w.takeoversReleased, r.spot)
	}
	r.apply([]location.Op{location.DeleteOp(e.Key, e.Version)}, "abort", r.dl(d), func(res storeRes) {
		r.answer(activation.AbortAnswered{Err: res.err})
	})
}

func (r *Runner) Delete(e activation.Delete, d activationrun.Deadline) {
	r.apply([]location.Op{location.DeleteOp(e.Key, e.Version)}, "delete", r.dl(d), func(res storeRes) {
		r.answer(activation.Deleted{Err: res.err, Now: r.Now()})
	})
}

func (r *Runner) DeleteRoot(rootKey string, d activationrun.Deadline) {
	r.w.store.call(r.life, storeOp{kind: opDeleteRoot, rootKey: rootKey, holder: r.first, why: rootKey}, r.dl(d), func(storeRes) {
		r.answer(nil)
	})
}

func (r *Runner) ReadOwner(owner *messages.Owner, d activationrun.Deadline) {
	r.life.ownerAlive(owner, r.dl(d), func(alive bool, err error) {
		r.answer(activation.OwnerRead{Alive: alive, Err: err})
	})
}

// ClaimCheckpoint claims the Spot's checkpoint; Config.Sabotage
// SabotageClaimFailStartsEmpty is a faulty claim that answers an empty
// state for a failed one.
func (r *Runner) ClaimCheckpoint(e activation.ClaimCheckpoint, _ activationrun.Deadline) {
	w, l, s := r.w, r.life, r.spot
	r.cpAsked, r.cpExpected = true, w.lastCheckpointState(s)
	failed := !w.over && w.chance(w.faults.PStageFail)
	if mode, _, ok := w.checkpointFault(l, opCheckpointClaim, s); ok && mode != simkit.ModeOK {
		failed = true
	}
	if failed && w.cfg.Sabotage == SabotageClaimFailStartsEmpty {
		r.cpClaimNo = s.cpClaims
		r.answer(activation.CheckpointClaimed{})
		return
	}
	if failed {
		r.answer(activation.CheckpointClaimed{Err: fmt.Errorf("%w: claim: the store did not answer", roamerr.ErrUnavailable)})
		return
	}
	state, restore := w.claim(s, e.Generation, e.OwnerGeneration)
	r.cpClaimNo = s.cpClaims
	r.answer(activation.CheckpointClaimed{State: state, Restore: restore})
}

func (r *Runner) Stage(e activation.Stage, _ activationrun.Deadline) {
	w, l, s := r.w, r.life, r.spot
	var err error
	if !w.over && w.chance(w.faults.PStageFail) {
		err = fmt.Errorf("%w: stage %s: spawn failed", roamerr.ErrUnavailable, e.Key.ID)
	} else {
		r.staged, err = l.stage(s, e.Generation, e.OwnerGeneration)
		r.commitGen, r.commitOwnerGen, r.commitSent = e.Generation, e.OwnerGeneration, false
		if err != nil {
			err = fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
		} else {
			if e.NoCheckpoint {
				// The reservation's check stands for the claim: the
				// incarnation must start from what the store holds now
				// (nothing, unless the check was skipped), and no write
				// of an earlier incarnation may land after it.
				r.cpAsked, r.cpExpected = true, w.lastCheckpointState(s)
				w.claimed(s)
				r.cpClaimNo = s.cpClaims
			}
			r.staged.cpAsked, r.staged.cpExpected, r.staged.cpClaimNo = r.cpAsked, r.cpExpected, r.cpClaimNo
			if e.Restore {
				w.restore(r.staged, e.State)
			}
		}
	}
	r.answer(activation.Staged{Err: err})
}

func (r *Runner) DiscardStaged() {
	w := r.w
	if r.commitSent {
		w.discardedCommits = append(w.discardedCommits, incName{spot: r.spot, gen: r.commitGen, ownerGen: r.commitOwnerGen})
	}
	if r.staged != nil {
		w.discard(r.staged)
		r.staged = nil
	}
}

func (r *Runner) Open(e activation.Open, _ activationrun.Deadline) {
	w, l, s := r.w, r.life, r.spot
	if l.ended {
		// Staged.Open refuses on an ended lifecycle.
		r.answer(activation.Opened{Err: fmt.Errorf("%w: open: the node's owner lease ended", roamerr.ErrUnavailable)})
		return
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
	r.answer(activation.Opened{})
}

func (r *Runner) Forward(e activation.Forward) {
	w, l, s := r.w, r.life, r.spot
	to := w.lifeByAddress(e.Address)
	pid := pidKey{spot: s.id, gen: e.Record.GetObjectGeneration(), ownerGen: e.Record.GetAuthorityOwnerGeneration()}
	if w.Tracing() {
		w.tracef("%s forwards m%d → %s on %s", r, r.first.id, pid, to)
	}
	if to == nil {
		w.lostMsg(r.first, lossTransit, "forwarded to an unknown address")
		return
	}
	l.send(to, &packet{kind: pApp, msg: r.first, pid: pid})
}

func (r *Runner) PassOn(d activationrun.Deadline) {
	r.life.passOn(r.env, r.first, r.dl(d), func(ok bool) { r.answer(activation.PassedOn{OK: ok}) })
}

func (r *Runner) RespondFailure(err error) {
	w := r.w
	w.checkClass(r.String()+" answers", err)
	if r.first != nil {
		c := code(err)
		w.answerFailure(r.life, r.first, failure{code: c, definite: c != roamerr.CodeDeadlineExceeded, why: "activation failed: " + err.Error()})
	}
}

func (r *Runner) CloseLocal(e activation.CloseLocal, d activationrun.Deadline) {
	w := r.w
	answered := false
	answer := func(err error) {
		if !answered {
			answered = true
			r.answer(activation.LocalClosed{Err: err})
		}
	}
	w.closeLocal(r.life, r.spot, e.Generation, answer)
	if dl := r.dl(d); !answered && dl > 0 {
		w.at(dl, func() {
			answer(fmt.Errorf("%w: accepted turns still running: %w", roamerr.ErrDeadlineExceeded, context.DeadlineExceeded))
		})
	}
}

func (r *Runner) DropRoute(string) { r.life.dropRoute(r.spot) }

func (r *Runner) Measure(e activation.Measure) {
	switch {
	case e.Activated:
		r.w.stats.Activated++
	case e.Outcome == "forwarded":
		r.w.stats.Forwarded++
	}
}

func (r *Runner) Log(l activation.Log) { r.w.logged(r, l) }

// Arm schedules a's fire; the interpreter drops a fire that no longer
// counts, so Stop has nothing to cancel.
func (r *Runner) Arm(a activationrun.Arming, after time.Duration, at time.Time) {
	w := r.w
	when := w.Now() + after
	if !at.IsZero() {
		when = w.logical(at)
	}
	w.at(when, func() { r.ar.Fire(a) })
}

func (r *Runner) Stop(activation.Timer) {}

func (r *Runner) Stalled() {
	v := r.w.violate("machine-stalled", "%s waits for nothing", r)
	v.Obj = r.spot.id
}

// Done: what the machine held is given back; its resumed first message,
// if it never opened, is dropped here.
func (r *Runner) Done(err error) {
	r.done, r.err = true, err
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
