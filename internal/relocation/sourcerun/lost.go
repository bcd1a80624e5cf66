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
//
// giveBack runs first, once: it gives back the in-flight budget of every
// move to peer (budget.LostPeer). Given back move by move, between their
// resends, one move's release would send another's queued chunks on the
// new connection, which that move's own loss would then count as lost and
// send again.
func ConnectionLost[T any](runs iter.Seq[T], targetIsPeer func(T) bool, giveBack func(), step func(T, handoff.Event)) {
	giveBack()
	for r := range runs {
		if targetIsPeer(r) {
			step(r, handoff.ConnectionLost{})
		}
	}
}
