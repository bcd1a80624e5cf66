package simkit

import "time"

// RandomCuts schedules up to two link cuts at random times before
// horizon, each between two distinct of nodes places, one way or both, for
// 1 ms to cutFor: cut runs at that time (and decides whether the schedule
// still takes faults then).
func (h *Harness) RandomCuts(nodes int, horizon, cutFor time.Duration, cut func(a, b int, both bool, d time.Duration)) {
	r := h.Rand
	for k := r.IntN(3); k > 0; k-- {
		at, a, b, both, d := r.Dur(0, horizon), r.IntN(nodes), r.IntN(nodes-1), r.IntN(2) == 0, r.Dur(time.Millisecond, cutFor)
		b = (a + 1 + b) % nodes
		h.At(at, func() { cut(a, b, both, d) })
	}
}

// RandomOutages schedules up to two store outages at random times before
// horizon, each lasting 5 ms to longest: outage(who, d) runs at that time,
// with who == nodes for the whole store and a node's index for that node's
// path to it. One schedule in longOneIn also gets, at a random time in the
// first half, an outage that lasts until the faults stop: long runs then.
func (h *Harness) RandomOutages(nodes int, horizon, longest time.Duration, longOneIn int, outage func(who int, d time.Duration), long func()) {
	r := h.Rand
	for k := r.IntN(3); k > 0; k-- {
		at, d, who := r.Dur(0, horizon), r.Dur(5*time.Millisecond, longest), r.IntN(nodes+1)
		h.At(at, func() { outage(who, d) })
	}
	if r.IntN(longOneIn) == 0 {
		h.At(r.Dur(0, horizon/2), long)
	}
}

// Profile is a random schedule's fault profile: which kinds of fault its
// generator draws chances and times for. A schedule draws one (DrawProfile)
// before any other fault, so that every kind alone, all of them and
// none are each a sixth of the schedules.
type Profile int

// DrawProfile draws the schedule's profile.
func (h *Harness) DrawProfile() Profile { return Profile(h.Rand.IntN(6)) }

// StoreAnswers: per-call store faults (indeterminate, unavailable, slow
// answers) at drawn chances.
func (p Profile) StoreAnswers() bool { return p == 1 || p == 5 }

// Packets: slow packets and links cut at protocol moments, at drawn
// chances.
func (p Profile) Packets() bool { return p == 2 || p == 5 }

// Crashes: crashes (and the like) at protocol moments, at drawn chances.
func (p Profile) Crashes() bool { return p == 3 || p == 5 }

// Thin: every kind of fault, each at a small fixed chance.
func (p Profile) Thin() bool { return p == 4 }

// LinkCuts: link cuts at random times (RandomCuts).
func (p Profile) LinkCuts() bool { return p >= 2 }

// StoreOutages: store outages at random times (RandomOutages).
func (p Profile) StoreOutages() bool { return p == 1 || p >= 4 }

// NodeFaults: a node fault (a crash, a stop, a lease cut) at a random
// time, as the simulation draws it.
func (p Profile) NodeFaults() bool { return p >= 3 }
