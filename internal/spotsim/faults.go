package spotsim

import (
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/simkit"
)

// Faults is a schedule's fault mix. The store and packet probabilities
// apply to every call and packet before the horizon; the P*At ones are
// tried at moments of the machines (before the named effects run), which
// is how random schedules reach the narrow windows of an activation.
type Faults struct {
	// Store answers (per call; no hang): slow applies and answers up to
	// SlowFor late.
	simkit.StoreFaults
	SlowFor time.Duration
	// PSlowPacket delays a packet by up to SlowPacket (streams stay FIFO).
	PSlowPacket float64
	SlowPacket  time.Duration
	// PDropCmd39: the connection carrying a SpotActivation resets with it in
	// flight (a cut of up to CutFor in one or both directions).
	PDropCmd39 float64
	CutFor     time.Duration
	// PStageFail: a Stage fails (the spawn is refused).
	PStageFail float64
	// PCloseSelf: after a handled message, the Spot closes itself
	// (CloseSelf).
	PCloseSelf float64
	// PCrashAt: at a reservation, a Ready commit, an Open, a takeover or a
	// pointer removal, crash the node within 3 ms.
	PCrashAt float64
	// PStoreCutAt: at the same moments, cut the node from the store for
	// up to StoreCutFor (long enough, at times, to fence it and end its
	// lease).
	PStoreCutAt float64
	StoreCutFor time.Duration
}

func (w *World) crashWithin(n *Node, d time.Duration) {
	cur := n.cur
	w.after(w.randDur(0, d), func() {
		if n.cur == cur && cur != nil {
			w.tracef("%s CRASHES", n.name)
			n.crash()
		}
	})
}

// storeCutFor cuts n from the store for d.
func (w *World) storeCutFor(n *Node, d time.Duration) {
	if n.storeCut {
		return
	}
	w.stats.StoreOutages++
	n.storeCut = true
	w.tracef("%s cut from the store for %s", n.name, ms(d))
	w.after(d, func() { n.storeCut = false })
}

// beforeEffect injects the moment faults.
func (w *World) beforeEffect(r *Runner, e activation.Effect) {
	if w.over {
		return
	}
	f := w.faults
	moment := false
	switch e := e.(type) {
	case activation.Reserve, activation.Open:
		moment = true
	case activation.CompareAndSet:
		moment = r.kind == "activation" || r.kind == "clear" || r.kind == "recovery"
		_ = e
	}
	if !moment {
		return
	}
	if w.chance(f.PCrashAt) {
		w.crashWithin(r.life.node, 3*time.Millisecond)
	}
	if w.chance(f.PStoreCutAt) {
		w.storeCutFor(r.life.node, w.randDur(10*time.Millisecond, f.StoreCutFor))
	}
}

// Random builds the random schedule of seed: Spot kinds, a fault
// profile, client traffic, link cuts, store outages and crashes, all
// drawn from the world's one random source, so the seed replays it.
func Random(cfg Config, seed uint64) *World {
	w := NewWorld(cfg, seed, nil)
	rng := w.Rand
	h := cfg.Horizon
	for _, s := range w.spots {
		switch rng.IntN(3) {
		case 1:
			s.kind.PreservesState = true
		case 2:
			s.kind.PreservesState, s.kind.ReactivateEmpty = true, true
		}
	}
	if rng.IntN(6) == 0 {
		w.nodes[rng.IntN(cfg.Nodes)].capacity = 1
	}
	f := &Faults{SlowFor: 1500 * time.Millisecond, SlowPacket: 300 * time.Millisecond, CutFor: 800 * time.Millisecond,
		StoreCutFor: 4 * time.Second}
	profile := w.DrawProfile()
	if profile.StoreAnswers() {
		f.StoreFaults = rng.DrawStoreFaults(0.03, simkit.StoreFaults{PIndetApplied: 0.12, PIndetNotApplied: 0.1, PUnavailable: 0.1, PSlow: 0.1})
	}
	if profile.Packets() {
		f.PSlowPacket = rng.Float64() * 0.2
		f.PDropCmd39 = rng.Float64() * 0.2
	}
	if profile.Crashes() {
		f.PCrashAt = rng.Float64() * 0.15
		f.PStoreCutAt = rng.Float64() * 0.1
	}
	if profile.Thin() {
		f.PIndetApplied, f.PIndetNotApplied, f.PUnavailable, f.PSlow = 0.03, 0.02, 0.02, 0.02
		f.PSlowPacket, f.PDropCmd39 = 0.03, 0.03
		f.PCrashAt, f.PStoreCutAt = 0.03, 0.02
	}
	f.PStageFail = 0.02 * float64(rng.IntN(2))
	f.PCloseSelf = 0.04 * float64(rng.IntN(2))
	w.faults = f

	// Traffic: each client calls a few Spots (half requests), often twice
	// in a row with no pause.
	hot := rng.IntN(cfg.Spots)
	for _, c := range w.clients {
		for k := 3 + rng.IntN(7); k > 0; k-- {
			s := w.spots[hot]
			if rng.IntN(3) == 0 {
				s = w.spots[rng.IntN(cfg.Spots)]
			}
			think := time.Duration(0)
			if rng.IntN(3) > 0 {
				think = w.randDur(time.Millisecond, 400*time.Millisecond)
			}
			c.plan = append(c.plan, planned{spot: s, request: rng.IntN(2) == 0, think: think})
		}
		c := c
		w.at(w.randDur(0, h/2), c.issue)
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
		w.RandomOutages(cfg.Nodes, h, 1500*time.Millisecond, 10, func(who int, d time.Duration) {
			if w.over {
				return
			}
			if who == cfg.Nodes {
				w.stats.StoreOutages++
				w.store.down = true
				w.tracef("store DOWN for %s", ms(d))
				w.after(d, func() { w.store.down = false; w.tracef("store up") })
				return
			}
			w.storeCutFor(w.nodes[who], d)
		}, func() {
			if !w.over {
				w.stats.StoreOutages++
				w.store.down = true
				w.tracef("store DOWN (until the horizon)")
			}
		})
	}
	// A lease that ends while the node lives: one node cut from the store
	// for longer than the TTL, early enough for its lease to end before
	// the horizon, while the others still call its Spots.
	if profile.NodeFaults() && rng.IntN(3) == 0 {
		at, who, d := w.randDur(0, h/3), rng.IntN(cfg.Nodes), w.randDur(cfg.LeaseTTL+200*time.Millisecond, cfg.LeaseTTL+1500*time.Millisecond)
		w.at(at, func() {
			if !w.over {
				w.storeCutFor(w.nodes[who], d)
			}
		})
	}
	// A crash at a random time.
	if profile.NodeFaults() && rng.IntN(3) == 0 {
		at, who := w.randDur(0, h), rng.IntN(cfg.Nodes)
		w.at(at, func() {
			if !w.over {
				w.tracef("%s CRASHES", w.nodes[who].name)
				w.nodes[who].crash()
			}
		})
	}
	w.probes()
	return w
}
