package sim

import (
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
)

// Faults is a schedule's fault mix. The store and packet probabilities
// apply to every call and packet before the horizon; the P*At* ones are
// tried at protocol moments (before the named effects run), which is how
// random schedules reach the narrow windows of the hand-off.
type Faults struct {
	// Store answers (per call): slow applies and answers late, maybe
	// after the caller gave up.
	simkit.StoreFaults
	// PSlowPacket delays a packet by up to SlowPacket (streams stay FIFO).
	PSlowPacket float64
	SlowPacket  time.Duration
	// PCrashTarget: at a target's SendRelayReady, CommitOwner or
	// OpenDispatch, crash its node within 3 ms.
	PCrashTarget float64
	// PCrashSource: at a source's SendPrepare, RelayThenCutover,
	// ConfirmCommit or Reinstate, crash its node within 3 ms.
	PCrashSource float64
	// PCutAtBoundary: at SendRelayReady or RelayThenCutover, cut the link
	// between the two nodes (one or both directions) for up to CutFor.
	PCutAtBoundary float64
	CutFor         time.Duration
	// PStopTarget: at SendRelayReady, stop the target node gracefully.
	PStopTarget float64
	// PStoreCutAtCommit: at CommitOwner, cut the target from the store for
	// up to CutFor.
	PStoreCutAtCommit float64
}

func (w *World) crashWithin(n *Node, d time.Duration) {
	life := n.life
	w.after(w.randDur(0, d), "crash", func() {
		if n.life == life {
			n.crash()
		}
	})
}

func (w *World) cutAround(a, b *Node) {
	d := w.randDur(time.Millisecond, w.faults.CutFor)
	switch w.Rand.IntN(3) {
	case 0:
		w.net.cut(a.idx, b.idx, true, d)
	case 1:
		w.net.cut(a.idx, b.idx, false, d)
	default:
		w.net.cut(b.idx, a.idx, false, d)
	}
}

// storeCutFor cuts n from the store for d.
func (w *World) storeCutFor(n *Node, d time.Duration) {
	w.stats.StoreOutages++
	n.storeCut = true
	w.tracef("%s cut from the store for %s", n.name, d)
	w.after(d, "store-cut-end", func() { n.storeCut = false })
}

func (w *World) beforeSourceEffect(r *SourceRun, e handoff.Effect) {
	if w.hooks.SourceEffect != nil {
		w.hooks.SourceEffect(w, r, e)
	}
	if w.over || r.dead {
		return
	}
	f := w.faults
	switch e.(type) {
	case handoff.SendPrepare, handoff.ConfirmCommit, handoff.Reinstate:
		if w.chance(f.PCrashSource) {
			w.crashWithin(r.node, 3*time.Millisecond)
		}
	case handoff.RelayThenCutover:
		if w.chance(f.PCrashSource) {
			w.crashWithin(r.node, 3*time.Millisecond)
		}
		if w.chance(f.PCutAtBoundary) {
			w.cutAround(r.node, r.target)
		}
	}
}

func (w *World) beforeTargetEffect(t *TargetRun, e handoff.Effect) {
	if w.hooks.TargetEffect != nil {
		w.hooks.TargetEffect(w, t, e)
	}
	if w.over || t.dead {
		return
	}
	f := w.faults
	switch e.(type) {
	case handoff.SendRelayReady:
		if w.chance(f.PCrashTarget) {
			w.crashWithin(t.node, 3*time.Millisecond)
		}
		if w.chance(f.PCutAtBoundary) {
			w.cutAround(t.node, t.source)
		}
		if w.chance(f.PStopTarget) {
			n := t.node
			w.after(w.randDur(0, 3*time.Millisecond), "stop", n.stop)
		}
	case handoff.CommitOwner:
		if w.chance(f.PCrashTarget) {
			w.crashWithin(t.node, 3*time.Millisecond)
		}
		if w.chance(f.PStoreCutAtCommit) {
			w.storeCutFor(t.node, w.randDur(time.Millisecond, f.CutFor))
		}
	case handoff.OpenDispatch:
		if w.chance(f.PCrashTarget / 2) {
			w.crashWithin(t.node, 3*time.Millisecond)
		}
	}
}

// Random builds the random schedule of seed: a fault profile, client
// traffic, moves, link cuts, store outages, crashes and stops, all drawn
// from the world's one random source, so the seed replays it exactly.
//
// Which objects are SpotWide Spots, their members, the sends to members
// and the moves of a member alone are drawn from a stream of their own
// (unitStream), after the rest: a seed draws its faults, traffic and
// moves as it did before units were modelled.
func Random(cfg Config, seed uint64) *World {
	urng := simkit.NewRand(seed, unitStream)
	if cfg.Members == nil {
		drawUnits(&cfg, urng)
	}
	brng := simkit.NewRand(seed, budgetStream)
	if cfg.RandomBudget {
		drawBudget(&cfg, brng)
	}
	if simkit.NewRand(seed, checkStream).IntN(2) == 0 {
		cfg.NoSourceCheck = true
	}
	w := NewWorld(cfg, seed, nil)
	rng := w.Rand
	h := cfg.Horizon
	f := &Faults{SlowPacket: 250 * time.Millisecond, CutFor: 1500 * time.Millisecond}
	profile := w.DrawProfile()
	if profile.StoreAnswers() {
		f.StoreFaults = rng.DrawStoreFaults(0.05, simkit.StoreFaults{PIndetApplied: 0.15, PIndetNotApplied: 0.15, PUnavailable: 0.15, PSlow: 0.15, PHang: 0.05})
		f.PStoreCutAtCommit = rng.Float64() * 0.3
	}
	if profile.Packets() {
		f.PSlowPacket = rng.Float64() * 0.1
		f.PCutAtBoundary = rng.Float64() * 0.4
	}
	if profile.Crashes() {
		f.PCrashTarget = rng.Float64() * 0.3
		f.PCrashSource = rng.Float64() * 0.15
		f.PStopTarget = rng.Float64() * 0.1
	}
	if profile.Thin() {
		// everything, thinly
		f.PIndetApplied, f.PIndetNotApplied, f.PUnavailable, f.PSlow = 0.03, 0.03, 0.03, 0.03
		f.PSlowPacket, f.PCutAtBoundary = 0.02, 0.1
		f.PCrashTarget, f.PCrashSource, f.PStopTarget, f.PStoreCutAtCommit = 0.08, 0.04, 0.03, 0.1
	}
	w.faults = f

	// Traffic: each client sends to random objects, half requests; now and
	// then it re-resolves its route on its own.
	for _, c := range w.clients {
		for k := 5 + rng.IntN(16); k > 0; k-- {
			w.scheduleSend(w.randDur(0, h), c, ObjID(rng.IntN(cfg.Objects)), rng.IntN(2) == 0, rng.IntN(5) == 0)
		}
	}
	// Moves.
	for k := 1 + rng.IntN(5); k > 0; k-- {
		at, o, pick := w.randDur(0, h*4/5), ObjID(rng.IntN(cfg.Objects)), rng.IntN(cfg.Nodes-1)
		w.at(at, "move", func() {
			if w.over {
				return
			}
			for _, n := range w.nodes {
				if n.objects[o] != nil && n.alive {
					w.StartMove(o, w.nodes[(n.idx+1+pick)%cfg.Nodes])
					return
				}
			}
		})
	}
	// Link cuts at random times.
	if profile.LinkCuts() {
		w.RandomCuts(cfg.Nodes, h, f.CutFor, func(a, b int, both bool, d time.Duration) {
			if !w.over {
				w.net.cut(a, b, both, d)
			}
		})
	}
	// Store outages: for everyone, or one node cut from the store; rarely,
	// one past the lease TTL: every lifecycle ends.
	if profile.StoreOutages() {
		w.RandomOutages(cfg.Nodes, h, 2*cfg.RestoreTimeout+200*time.Millisecond, 20, func(who int, d time.Duration) {
			if w.over {
				return
			}
			if who == cfg.Nodes {
				w.stats.StoreOutages++
				w.store.down = true
				w.tracef("store DOWN for %s", d)
				w.after(d, "store-up", func() { w.store.down = false; w.tracef("store up") })
				return
			}
			w.storeCutFor(w.nodes[who], d)
		}, func() {
			if !w.over {
				w.stats.StoreOutages++
				w.store.down = true
				w.tracef("store DOWN (long)")
			}
		})
	}
	w.unitTraffic(urng)
	w.budgetTraffic(brng)
	w.joinTraffic(simkit.NewRand(seed, joinStream))
	// A crash or a stop at a random time.
	if profile.NodeFaults() {
		if rng.IntN(4) == 0 {
			at, who := w.randDur(0, h), rng.IntN(cfg.Nodes)
			w.at(at, "crash", func() {
				if !w.over {
					w.nodes[who].crash()
				}
			})
		}
		if rng.IntN(6) == 0 {
			at, who := w.randDur(0, h), rng.IntN(cfg.Nodes)
			w.at(at, "stop", func() {
				if !w.over {
					w.nodes[who].stop()
				}
			})
		}
	}
	return w
}
