package sourcerun

import (
	"iter"

	"github.com/roamactors/roam/internal/relocation/handoff"
)

// ConnectionLost routes the end of a node's connection to peer to the
// moves it concerns: every move out of this node whose target is peer is
// stepped with handoff.ConnectionLost, which its machine judges by its
// phase. A move into this node from peer is not told: it ends by its own
// timers and the store, since a lost connection says nothing of whether
// the source committed. The driver and the hand-off simulation both call
// it, each with its own runs; step may do the host's bookkeeping first.
func ConnectionLost[T any](runs iter.Seq[T], targetIsPeer func(T) bool, step func(T, handoff.Event)) {
	for r := range runs {
		if targetIsPeer(r) {
			step(r, handoff.ConnectionLost{})
		}
	}
}
