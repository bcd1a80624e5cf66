package handoff

import (
	"errors"
	"fmt"
	"slices"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// ArrivalSlots accounts for the capacity slots a move into a node bounded
// by them takes before relay-ready, one per participant (PROTOCOL.md
// §7.12): which the commit activates, which the move holds for nothing
// when it ends without one. Every slot a take may have taken is freed
// unless the commit names it.
type ArrivalSlots struct {
	// Slots are those taken, in participant order; nil until a take
	// applied.
	Slots []uint32
	// taking are those a take is taking now (picked, its transaction sent
	// or about to be): the move's own already, for any free of another
	// move that names them.
	taking []uint32
	// strays are those a take with an unknown outcome may hold.
	strays []uint32
	// done: the move ended; a take still running frees what it took.
	done bool
}

// Held are the slots this move holds, or is taking, while it runs (none
// once it ended: a commit made them its objects', or they are being
// freed).
func (a *ArrivalSlots) Held() []uint32 {
	if a.done {
		return nil
	}
	return append(slices.Clip(a.Slots), a.taking...)
}

// Taking notes the slots a take picked, before its transaction is sent.
func (a *ArrivalSlots) Taking(slots []uint32) { a.taking = slices.Clone(slots) }

// Wanted reports whether a take is still to be made.
func (a *ArrivalSlots) Wanted() bool { return a.Slots == nil }

// Taken takes a take's answer: the slots it named and its error. It
// returns the slots to free now and the take's result for the move: a
// take that ended after the move did frees what it may hold, and fails
// Unavailable.
func (a *ArrivalSlots) Taken(slots []uint32, err error) (free []uint32, result error) {
	a.taking = nil
	unknown := errors.Is(err, location.ErrIndeterminate)
	switch {
	case a.done:
		if err == nil || unknown {
			return slots, fmt.Errorf("%w: the move ended", roamerr.ErrUnavailable)
		}
	case err == nil:
		a.Slots = slots
		// A slot taken again was free when read: an earlier take of it
		// whose answer was lost did not apply, and it is this move's now.
		a.strays = slices.DeleteFunc(a.strays, func(s uint32) bool { return slices.Contains(slots, s) })
	case unknown:
		a.strays = append(a.strays, slots...)
	}
	return nil, err
}

// Complete ends the move, committed or not, and returns the slots to
// free: those a take with an unknown outcome may hold, and without a
// commit those taken too.
func (a *ArrivalSlots) Complete(committed bool) []uint32 {
	free := a.strays
	if !committed {
		free = append(free, a.Slots...)
	}
	a.strays, a.done = nil, true
	return free
}
