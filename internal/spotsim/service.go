package spotsim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The Spot service of one lifecycle (manager.go, activate.go,
// closeself.go): SpotActivations run one at a time per Spot ID in arrival
// order, each an Activation machine to its end; the start-up scan; the
// recovery pointer's removal; an Instance Spot's own close.

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
	i := m.spot.idx
	l.queues[i] = append(l.queues[i], cmd39{env: env, m: m})
	if l.working[i] {
		return
	}
	l.working[i] = true
	w.after(0, func() { l.nextActivation(m.spot) })
}

func (l *Life) nextActivation(s *Spot) {
	if l.gone {
		return
	}
	i := s.idx
	if len(l.queues[i]) == 0 {
		l.working[i] = false
		return
	}
	c := l.queues[i][0]
	l.queues[i] = l.queues[i][1:]
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

// recoverScan is Manager.Recover, run once when a lifecycle starts: every
// Instance Spot record goes through the recovery machine, one after the
// other, within a minute. A failed listing ends the scan (logged).
func (l *Life) recoverScan() {
	w := l.w
	deadline := w.Now() + time.Minute
	w.store.call(l, storeOp{kind: opList, why: "start-up scan"}, deadline, func(res storeRes) {
		if res.err != nil {
			w.tracef("%s spot_recovery_failed: %s", l, errString(res.err))
			return
		}
		var next func(i int)
		next = func(i int) {
			if i >= len(res.list) || l.gone {
				return
			}
			v := res.list[i]
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
	full := append(slices.Clone(env.GetFullNodeRids()), l.rid)
	w.store.call(l, storeOp{kind: opListNodes, why: "pass on"}, deadline, func(res storeRes) {
		if res.err != nil {
			done(false)
			return
		}
		for _, n := range candidates(res.nodes, env.GetSpotId()) {
			if slices.Contains(full, n.rid) {
				continue
			}
			next := proto.Clone(env).(*messages.SpotActivation)
			next.FullNodeRids = full
			next.TargetNodeRid, next.TargetNodeGeneration = n.rid, n.gen
			m.passedOn = true
			w.stats.PassedOn++
			l.send(n, &packet{kind: pCmd39, msg: m, env: next})
			done(true)
			return
		}
		done(false)
	})
}

// lock serialises this lifecycle's own work on one Spot ID (lockKey):
// granted runs when the caller holds it.
func (l *Life) lock(s *Spot, granted func()) {
	ls := l.locks[s.idx]
	if !ls.held {
		ls.held = true
		granted()
		return
	}
	ls.waiters = append(ls.waiters, granted)
}

func (l *Life) unlock(s *Spot) {
	ls := l.locks[s.idx]
	if len(ls.waiters) == 0 {
		ls.held = false
		return
	}
	next := ls.waiters[0]
	ls.waiters = ls.waiters[1:]
	l.w.after(0, func() {
		if !l.gone {
			next()
		}
	})
}

// ---- shared watches (manager.go watch) ----

type watchKey struct {
	key   location.AuthorityKey
	after location.StoreVersion
}

type sharedWatch struct {
	waiters []func(error)
}

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
	wk := watchKey{key, after}
	sw := l.watches[wk]
	if sw == nil {
		sw = &sharedWatch{}
		l.watches[wk] = sw
		w.store.call(l, storeOp{kind: opWatch, key: key, after: after, why: "watch " + key.ID}, w.Now()+sharedWatchTimeout, func(res storeRes) {
			err := res.err
			if errors.Is(err, context.DeadlineExceeded) {
				err = nil // timed out: the waiters read again
			} else if err != nil {
				err = activation.StoreError("watch "+key.String(), err)
			}
			delete(l.watches, wk)
			for _, f := range sw.waiters {
				f(err)
			}
		})
	}
	sw.waiters = append(sw.waiters, answer)
	if deadline > 0 {
		w.at(deadline, func() {
			answer(fmt.Errorf("%w: waiting for %s", roamerr.ErrDeadlineExceeded, key))
		})
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
				if rec.GetObjectGeneration() != gen || !activation.SameOwner(rec.GetOwner(), l.owner) || rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
					w.tracef("%s instance_close_failed: not Ready here", inc)
					unlock()
					return
				}
				closing := proto.Clone(rec).(*location.Record)
				closing.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
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
		rec := res.v.Record
		mine := rec.GetObjectGeneration() == gen && activation.SameOwner(rec.GetOwner(), l.owner)
		switch {
		case !mine:
			w.tracef("%s instance_close_failed: changed while unsettled", inc)
			unlock()
		case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CLOSING && res.v.Version != version:
			l.closeAndRelease(s, gen, res.v.Version, ready, unlock)
		case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY && res.v.Version == version:
			w.store.call(l, storeOp{kind: opApply, key: s.key(), ops: []location.Op{location.UpdateOp(s.key(), version, ready)}, why: "fence closing " + s.id}, deadline, func(res storeRes) {
				if res.err == nil {
					w.tracef("%s instance_close_failed: Closing write fenced out", inc)
					unlock()
					return
				}
				retry()
			})
		case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY:
			w.tracef("%s instance_close_failed: moved past the Closing write", inc)
			unlock()
		default:
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
