package simkit

// StoreMode is how a simulation's store model answers one call.
type StoreMode int

const (
	ModeOK StoreMode = iota
	// ModeIndetApplied: the write applied; the answer is indeterminate.
	ModeIndetApplied
	// ModeIndetNotApplied: nothing applied; the answer is indeterminate
	// (a read: unavailable).
	ModeIndetNotApplied
	// ModeUnavailable: nothing applied, and the answer says so.
	ModeUnavailable
	// ModeSlow: applied late and answered late, possibly after the
	// caller's context ended (the caller then sees its deadline while the
	// write still lands).
	ModeSlow
	// ModeHang: nothing applied, no answer: the caller's deadline ends it.
	ModeHang
	// ModeLate: a delayed write: it applies after the latency a script
	// sets and is never answered (the caller's deadline ends the call).
	ModeLate
)

var storeModeNames = [...]string{"ok", "indeterminate-applied", "indeterminate-not-applied", "unavailable", "slow", "hang", "late"}

func (m StoreMode) String() string { return storeModeNames[m] }

// StoreModeNames are the names of the modes up to last: a store model
// that answers only those lets a script force only those.
func StoreModeNames(last StoreMode) []string { return storeModeNames[:last+1] }

// StoreFaults are the chances, per store call, of each answer but ok.
type StoreFaults struct {
	// Indeterminate after applying (writes only), indeterminate or
	// unavailable without applying, slow, hang.
	PIndetApplied, PIndetNotApplied, PUnavailable, PSlow, PHang float64
}

// Draw draws one call's answer from r (one draw, whatever the answer);
// only a write (write) can be answered indeterminate after applying.
func (f StoreFaults) Draw(r *Rand, write bool) StoreMode {
	x := r.Float64()
	switch {
	case x < f.PIndetApplied && write:
		return ModeIndetApplied
	case x < f.PIndetApplied+f.PIndetNotApplied:
		return ModeIndetNotApplied
	case x < f.PIndetApplied+f.PIndetNotApplied+f.PUnavailable:
		return ModeUnavailable
	case x < f.PIndetApplied+f.PIndetNotApplied+f.PUnavailable+f.PSlow:
		return ModeSlow
	case x < f.PIndetApplied+f.PIndetNotApplied+f.PUnavailable+f.PSlow+f.PHang:
		return ModeHang
	}
	return ModeOK
}

// DrawStoreFaults draws a schedule's per-call store chances: each chance
// uniformly up to its value in most, the indeterminate-applied one above
// least; a chance most leaves at 0 stays 0 and takes no draw.
func (r *Rand) DrawStoreFaults(least float64, most StoreFaults) StoreFaults {
	draw := func(max float64) float64 {
		if max == 0 {
			return 0
		}
		return r.Float64() * max
	}
	var f StoreFaults
	f.PIndetApplied = least + draw(most.PIndetApplied)
	f.PIndetNotApplied = draw(most.PIndetNotApplied)
	f.PUnavailable = draw(most.PUnavailable)
	f.PSlow = draw(most.PSlow)
	f.PHang = draw(most.PHang)
	return f
}
