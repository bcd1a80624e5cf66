package spotsim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
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

// recoverScan is Manager.Recover, run once when a lifecycle starts: the
// scan's walk (spotservice.Scan) lists each kind in one page, and every
// record it picks goes through the recovery machine, one after the other,
// all within a minute. A failed listing ends the scan (logged).
func (l *Life) recoverScan() {
	w := l.w
	deadline := w.Now() + time.Minute
	var scan spotservice.Scan
	var list func()
	list = func() {
		kind, _, ok := scan.Next()
		if !ok || l.gone {
			return
		}
		w.store.call(l, storeOp{kind: opList, key: location.AuthorityKey{Kind: kind}, why: "start-up scan"}, deadline, func(res storeRes) {
			if res.err != nil {
				w.tracef("%s spot_recovery_failed: %s", l, errString(res.err))
				return
			}
			todo := scan.Page(location.Page{Items: res.list})
			var next func(i int)
			next = func(i int) {
				if l.gone {
					return
				}
				if i >= len(todo) {
					list()
					return
				}
				v := todo[i]
				s := w.spotByID(v.Key.ID)
				w.stats.Recoveries++
				mc, effects := activation.NewRecovery(l.acfg, activation.Recover{Scanned: v, Kind: s.kind, Deadline: w.wall(deadline), Now: w.wall(w.Now())})
				r := l.newRunner("recovery", s, deadline, mc.Step, func(error) { w.after(0, func() { next(i + 1) }) })
				r.label = "rec"
				r.act = mc
				r.run(effects)
			}
			next(0)
		})
	}
	list()
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

// admitCapacity is Manager.admitCapacity: the incarnations served here
// plus the creations in progress must stay within the node's capacity.
func (l *Life) admitCapacity() error {
	c := l.node.capacity
	if c == 0 {
		return nil
	}
	l.pending++
	n := 0
	for _, inc := range l.incs {
		if inc.mode == mOpen && !inc.closing {
			n++
		}
	}
	if n+l.pending > c {
		l.pending--
		return fmt.Errorf("%w: node %s hosts %d and creates %d of %d", roamerr.ErrCapacityExceeded, l.rid, n, l.pending, c)
	}
	return nil
}

// passOn is Manager.passOn: another serving node that has not refused the
// envelope gets it.
func (l *Life) passOn(env *messages.SpotActivation, m *Msg, deadline time.Duration, done func(bool)) {
	w := l.w
	w.store.call(l, storeOp{kind: opListNodes, why: "pass on"}, deadline, func(res storeRes) {
		if res.err != nil {
			done(false)
			return
		}
		found := candidates(res.nodes, env.GetSpotId())
		cs := make([]spotservice.Candidate, len(found))
		for i, n := range found {
			cs[i] = spotservice.Candidate{RID: n.rid, Generation: n.gen}
		}
		next, i := spotservice.PassOn(env, l.rid, cs)
		if i < 0 {
			done(false)
			return
		}
		m.passedOn = true
		w.stats.PassedOn++
		l.send(found[i], &packet{kind: pCmd39, msg: m, env: next})
		done(true)
	})
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

// sharedWatchTimeout bounds one shared store watch; waiters re-read after.
const sharedWatchTimeout = 10 * time.Second

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
		w.store.call(l, storeOp{kind: opWatch, key: key, after: after, why: "watch " + key.ID}, w.Now()+sharedWatchTimeout, func(res storeRes) {
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
// ID's lock, the Closing write on the incarnation being closed (a Write
// machine alone, read again on a lost race), then the Release machine.
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
		unlock := func() { l.unlock(s) }
		var attempt func()
		attempt = func() {
			w.store.call(l, storeOp{kind: opRead, key: s.key(), why: "close " + s.id}, deadline, func(res storeRes) {
				if res.err != nil {
					w.tracef("%s instance_close_failed: %s", inc, errString(res.err))
					unlock()
					return
				}
				rec := res.v.Record
				closing := spotservice.Closing(rec, gen, l.owner)
				if closing == nil {
					w.tracef("%s instance_close_failed: not Ready here", inc)
					unlock()
					return
				}
				wm := activation.NewCompareAndSet(l.acfg, s.key(), res.v.Version, closing, w.wall(deadline)).Alone()
				r := l.newRunner("write", s, deadline, wm.Step, func(error) {
					switch outcome, cv, err := wm.Result(); outcome {
					case activation.Applied:
						w.after(0, func() { l.closeAndRelease(s, gen, cv, rec, unlock) })
					case activation.Lost:
						w.after(0, attempt)
					default:
						if errors.Is(err, roamerr.ErrDeadlineExceeded) {
							// Unknown outcome: settle it (closeself.go settleClosing).
							l.settleClosing(inc, s, gen, res.v.Version, rec, w.Now()+closeSettleFor, unlock)
							return
						}
						w.tracef("%s instance_close_failed: %s", inc, errString(err))
						unlock()
					}
				})
				r.label = "closing"
				r.run(wm.Start())
			})
		}
		attempt()
	})
}

// closeSettleFor is closeself.go's bound on settling a Closing write.
const closeSettleFor = 30 * time.Second

// settleClosing is Manager.settleClosing: re-read until the Closing write
// (expected at version) is known to have landed — then release — or the
// record is still Ready at version, which a compare-and-set of the same
// record fences; a record that moved past version while Ready also ends
// it. Gives up loudly at its deadline (closesGivenUp).
func (l *Life) settleClosing(inc *Inc, s *Spot, gen uint64, version location.StoreVersion, ready *location.Record, deadline time.Duration, unlock func()) {
	w := l.w
	retry := func() {
		if w.Now() >= deadline {
			w.tracef("%s spot_close_unsettled", inc)
			w.closesGivenUp = append(w.closesGivenUp, incName{spot: s, gen: gen})
			unlock()
			return
		}
		w.after(50*time.Millisecond, func() { l.settleClosing(inc, s, gen, version, ready, deadline, unlock) })
	}
	w.store.call(l, storeOp{kind: opRead, key: s.key(), why: "settle closing " + s.id}, deadline, func(res storeRes) {
		if res.err != nil {
			retry()
			return
		}
		switch spotservice.SettleClosing(res.v, version, gen, l.owner) {
		case spotservice.SettleChanged:
			w.tracef("%s instance_close_failed: changed while unsettled", inc)
			unlock()
		case spotservice.SettleLanded:
			l.closeAndRelease(s, gen, res.v.Version, ready, unlock)
		case spotservice.SettleFence:
			w.store.call(l, storeOp{kind: opApply, key: s.key(), ops: []location.Op{location.UpdateOp(s.key(), version, ready)}, why: "fence closing " + s.id}, deadline, func(res storeRes) {
				if res.err == nil {
					w.tracef("%s instance_close_failed: Closing write fenced out", inc)
					unlock()
					return
				}
				retry()
			})
		case spotservice.SettleMovedPast:
			w.tracef("%s instance_close_failed: moved past the Closing write", inc)
			unlock()
		case spotservice.SettleRetry:
			retry()
		}
	})
}

// closeAndRelease runs the Release machine after the Closing write.
func (l *Life) closeAndRelease(s *Spot, gen uint64, closingAt location.StoreVersion, wasReady *location.Record, unlock func()) {
	w := l.w
	mc, effects := activation.NewRelease(l.acfg, s.key(), gen, closingAt, wasReady, w.wall(w.Now()))
	r := l.newRunner("release", s, w.Now()+l.acfg.ReleaseFor, mc.Step, func(err error) {
		if err == nil {
			w.stats.Released++
		}
		unlock()
	})
	r.label = "release"
	r.run(effects)
}
