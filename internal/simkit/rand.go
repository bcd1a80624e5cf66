package simkit

import (
	"math/rand/v2"
	"time"
)

// Rand is a schedule's one random source: every draw of a schedule comes
// from it, in the order the schedule makes them, so a seed replays the
// schedule. Each simulation picks its own stream so that two simulations
// with one seed draw differently.
type Rand struct{ *rand.Rand }

// NewRand returns a PCG source for seed on stream.
func NewRand(seed, stream uint64) *Rand { return &Rand{rand.New(rand.NewPCG(seed, stream))} }

// Dur returns a uniform duration in [lo, hi] (lo if hi <= lo, with no
// draw).
func (r *Rand) Dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// Chance reports true with probability p; p <= 0 draws nothing, so a
// fault that is off does not move the schedule's later draws.
func (r *Rand) Chance(p float64) bool { return p > 0 && r.Float64() < p }
