package spotsim

import (
	"context"
	"errors"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// The Spot service of one lifecycle (manager.go, activate.go,
// closeself.go), hosting the driver's own decisions and orderings
// (spotservice) on the simulated store, network and clock:
// SpotActivations run one at a time per Spot ID in arrival order, each an
// Activation machine to its end; the start-up scan; the recovery
// pointer's removal; an Instance Spot's own close.

// cmd39 is a queued SpotActivation and its first message.
type cmd39 struct {
	env *messages.SpotActivation
	m   *Msg
}

// enqueueActivation queues a SpotActivation behind the earlier ones for the
// same Spot ID; one worker per ID runs them in arrival order.
func (l *Life) enqueueActivation(env *messages.SpotActivation, m *Msg) {
	w := l.w
	if w.cfg.Sabotage == SabotageNoIDQueue {
		l.onActivation(env, m, func() {})
		return
	}
	if l.queues.Push(m.spot.idx, cmd39{env: env, m: m}) {
		w.after(0, func() { l.nextActivation(m.spot) })
	}
}

func (l *Life) nextActivation(s *Spot) {
	if l.gone {
		return
	}
	c, ok := l.queues.Next(s.idx)
	if !ok {
		return
	}
	l.onActivation(c.env, c.m, func() { l.nextActivation(s) })
}

// onActivation is the target side of a SpotActivation: the Activation
// machine decides, a runner runs its effects (activate.go onActivation).
func (l *Life) onActivation(env *messages.SpotActivation, m *Msg, next func()) {
	w := l.w
	w.stats.Activations++
	st := activation.Start{Envelope: env, First: m, Kind: m.spot.kind, Now: w.wall(w.Now())}
	mc, effects := activation.NewActivation(l.acfg, st)
	r := l.newRunner("activation", m.spot, w.logical(time.Unix(0, env.GetDeadlineUnixNanos())), mc.Step, func(error) {
		w.after(0, next)
	})
	r.env, r.first, r.act = env, m, mc
	r.label, r.op = "act", env.GetOperationId()
	r.run(effects)
}

// recoverScan runs the driver's start-up scan (spotservice.RunScan) once
// when a lifecycle starts: here each kind is listed in one page, and
// every record it picks goes through the recovery machine, one after the
// other, all within a minute. A failed listing ends the scan (logged);
// a lifecycle gone drops it.
func (l *Life) recoverScan() {
	deadline := l.w.Now() + time.Minute
	spotservice.RunScan(scanEnv{l: l, deadline: deadline}, func(listErr error, _ []error) {
		if listErr != nil {
			l.w.tracef("%s spot_recovery_failed: %s", l, errString(listErr))
		}
	})
}

// scanEnv is spotservice.RunScan's host: the store model's listing and
// the recovery machine on its runner.
type scanEnv struct {
	l        *Life
	deadline time.Duration
}

func (e scanEnv) List(kind location.Kind, _ location.PageRequest, done func(location.Page, error)) {
	l := e.l
	if l.gone {
		return
	}
	l.w.store.call(l, storeOp{kind: opList, key: location.AuthorityKey{Kind: kind}, why: "start-up scan"}, e.deadline, func(res storeRes) {
		done(location.Page{Items: res.list}, res.err)
	})
}

func (e scanEnv) Recover(v location.Versioned, done func(error)) {
	l, w := e.l, e.l.w
	if l.gone {
		return
	}
	s := w.spotByID(v.Key.ID)
	w.stats.Recoveries++
	mc, effects := activation.NewRecovery(l.acfg, activation.Recover{Scanned: v, Kind: s.kind, Deadline: w.wall(e.deadline), Now: w.wall(w.Now())})
	r := l.newRunner("recovery", s, e.deadline, mc.Step, func(err error) { w.after(0, func() { done(err) }) })
	r.label = "rec"
	r.act = mc
	r.run(effects)
}

// clearRecovery removes an activation's recovery pointer once its first
// handler has completed, then deletes its root (the Clear machine), on a
// runner of its own bounded by ClearFor; settled lets the incarnation
// dispatch again once it finished.
func (l *Life) clearRecovery(s *Spot, key location.AuthorityKey, op, rootKey string, committed location.Versioned, settled func()) {
	w := l.w
	w.stats.Clears++
	mc, effects := activation.NewClear(l.acfg, key, op, rootKey, committed, w.wall(w.Now()))
	r := l.newRunner("clear", s, w.Now()+l.acfg.ClearFor, mc.Step, func(error) { settled() })
	r.label, r.op = "clear", op
	r.run(effects)
}

// admitCapacity admits one creation as spotservice.AdmitCapacity
// decides, the driver's own; the admitted creation holds a slot (pending)
// until it ends as spotservice.HoldsSlot says. Nodes here never drain.
func (l *Life) admitCapacity() (holds bool, err error) {
	c := l.node.capacity
	n := 0
	for _, inc := range l.incs {
		if inc.mode == mOpen && !inc.closing {
			n++
		}
	}
	if err := spotservice.AdmitCapacity(l.rid, false, uint32(c), n, l.pending); err != nil {
		return false, err
	}
	if !spotservice.HoldsSlot(false, uint32(c)) {
		return false, nil
	}
	l.pending++ // released by the runner's ReleaseCapacity
	return true, nil
}

// passOn passes an activation this full lifecycle refused on, by the
// driver's spotservice.RunPassOn.
func (l *Life) passOn(env *messages.SpotActivation, m *Msg, deadline time.Duration, done func(bool)) {
	spotservice.RunPassOn(passOnEnv{l: l, m: m, deadline: deadline}, env, l.rid, done)
}

// passOnEnv is spotservice.RunPassOn's host: the store model's listing
// and this world's packets.
type passOnEnv struct {
	l        *Life
	m        *Msg
	deadline time.Duration
}

func (e passOnEnv) ListNodes(_ string, done func([]location.VersionedNode, error)) {
	e.l.w.store.call(e.l, storeOp{kind: opListNodes, why: "pass on"}, e.deadline, func(res storeRes) {
		done(descriptors(res.nodes), res.err)
	})
}

func (e passOnEnv) Candidates(nodes []location.VersionedNode, a *messages.SpotActivation) []location.VersionedNode {
	return spotcall.Candidates(nodes, a.GetStableType(), true, a.GetSpotId())
}

func (e passOnEnv) Send(n location.VersionedNode, next *messages.SpotActivation) {
	w := e.l.w
	e.m.passedOn = true
	w.stats.PassedOn++
	e.l.send(w.lifeByRid(n.Node.GetNodeRid()), &packet{kind: pCmd39, msg: e.m, env: next})
}

// lock serialises this lifecycle's own work on one Spot ID (lockKey):
// granted runs when the caller holds it.
func (l *Life) lock(s *Spot, granted func()) {
	if l.locks.Acquire(s.idx, granted) {
		granted()
	}
}

func (l *Life) unlock(s *Spot) {
	next := l.locks.Release(s.idx)
	if next == nil {
		return
	}
	l.w.after(0, func() {
		if !l.gone {
			next()
		}
	})
}

// ---- shared watches (manager.go watch) ----

// watch waits until key moves past after, the shared watch times out
// (nil), or deadline (DeadlineExceeded). All of this lifecycle's waiters
// on the same key and version share one store watch.
func (l *Life) watch(key location.AuthorityKey, after location.StoreVersion, deadline time.Duration, done func(error)) {
	w := l.w
	answered := false
	answer := func(err error) {
		if !answered {
			answered = true
			done(err)
		}
	}
	wk := spotservice.WatchKey{Key: key, After: after}
	if l.watches.Join(wk, answer) {
		w.store.call(l, storeOp{kind: opWatch, key: key, after: after, why: "watch " + key.ID}, w.Now()+spotservice.SharedWatchTimeout, func(res storeRes) {
			waiters, result := l.watches.Finish(wk, res.err, errors.Is(res.err, context.DeadlineExceeded))
			for _, f := range waiters {
				f(result)
			}
		})
	}
	if deadline > 0 {
		w.at(deadline, func() { answer(spotservice.WaitExpired(key, nil)) })
	}
}

// ---- an Instance Spot's own close (closeself.go) ----

// closeInstance is CloseSelf after the handler's turn: under the Spot
// ID's lock, the driver's own close (spotservice.CloseSelf) on the
// simulated store.
func (l *Life) closeInstance(inc *Inc) {
	w := l.w
	s := inc.spot
	w.stats.Closes++
	w.tracef("%s asks to close itself", inc)
	deadline := w.Now() + w.cfg.CallTimeout
	gen := inc.pid.gen
	if l.objects[s.idx] != inc || inc.closing {
		return
	}
	l.lock(s, func() {
		spotservice.CloseSelf(&closeHost{l: l, inc: inc, s: s, gen: gen, deadline: deadline}, s.key(), gen, l.owner)
	})
}

// closeHost is spotservice.CloseEnv on the simulated store and clock.
type closeHost struct {
	l         *Life
	inc       *Inc
	s         *Spot
	gen       uint64
	deadline  time.Duration
	settleBy  time.Duration // from the first settling read
	unsettled bool
}

func (h *closeHost) Read(done func(location.Versioned, error)) {
	h.l.w.store.call(h.l, storeOp{kind: opRead, key: h.s.key(), why: "close " + h.s.id}, h.deadline, func(res storeRes) { done(res.v, res.err) })
}

func (h *closeHost) WriteClosing(version location.StoreVersion, closing *location.Record, done func(activation.Outcome, location.StoreVersion, error)) {
	w, l := h.l.w, h.l
	wm := activation.NewCompareAndSet(l.acfg, h.s.key(), version, closing, w.wall(h.deadline)).Alone()
	r := l.newRunner("write", h.s, h.deadline, wm.Step, func(runErr error) {
		outcome, cv, err := wm.Result()
		switch outcome {
		case activation.Applied, activation.Lost:
			w.after(0, func() { done(outcome, cv, err) })
			return
		case activation.Pending:
			err = runErr
		}
		done(outcome, cv, err)
	})
	r.label = "closing"
	r.run(wm.Start())
}

func (h *closeHost) settling() time.Duration {
	if h.settleBy == 0 {
		h.settleBy = h.l.w.Now() + spotservice.CloseSettleFor
	}
	return h.settleBy
}

func (h *closeHost) SettleRead(done func(location.Versioned, error)) {
	h.l.w.store.call(h.l, storeOp{kind: opRead, key: h.s.key(), why: "settle closing " + h.s.id}, h.settling(), func(res storeRes) { done(res.v, res.err) })
}

func (h *closeHost) Fence(version location.StoreVersion, ready *location.Record, done func(error)) {
	key := h.s.key()
	h.l.w.store.call(h.l, storeOp{kind: opApply, key: key, ops: []location.Op{location.UpdateOp(key, version, ready)}, why: "fence closing " + h.s.id}, h.settling(), func(res storeRes) { done(res.err) })
}

func (h *closeHost) Pace(again func()) bool {
	w := h.l.w
	if w.Now() >= h.settling() {
		return false
	}
	w.after(spotservice.CloseSettlePace, again)
	return true
}

func (h *closeHost) Unsettled(error) {
	w := h.l.w
	h.unsettled = true
	w.tracef("%s spot_close_unsettled", h.inc)
	w.closesGivenUp = append(w.closesGivenUp, incName{spot: h.s, gen: h.gen})
}

// Release runs the Release machine after the Closing write.
func (h *closeHost) Release(closingAt location.StoreVersion, ready *location.Record, done func(error)) {
	w, l := h.l.w, h.l
	mc, effects := activation.NewRelease(l.acfg, h.s.key(), h.gen, closingAt, ready, w.wall(w.Now()))
	r := l.newRunner("release", h.s, w.Now()+l.acfg.ReleaseFor, mc.Step, func(err error) {
		if err == nil {
			w.stats.Released++
		}
		done(err)
	})
	r.label = "release"
	r.run(effects)
}

func (h *closeHost) Done(err error) {
	if err != nil && !h.unsettled {
		h.l.w.tracef("%s instance_close_failed: %s", h.inc, err)
	}
	h.l.unlock(h.s)
}
