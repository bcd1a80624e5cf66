package targetrun

import (
	"iter"

	"github.com/roamactors/roam/internal/relocation/handoff"
)

// Stopping is a stopping node's look at its moves in (Extension.Stop,
// FinishIncoming): every move not finished is told handoff.NodeStopping
// (one still restoring is refused; one past relay-ready goes on, since
// its source already relays to it) by step, and busy counts those still
// running after it. The node polls this until busy is zero, within its
// bound, before it gives up its lease. The driver and the hand-off
// simulation both call it, each with its own runs.
func Stopping[T any](runs iter.Seq[T], machine func(T) *handoff.Target, step func(T, handoff.Event)) (busy int) {
	for t := range runs {
		if !machine(t).Finished() {
			step(t, handoff.NodeStopping{})
		}
		if !machine(t).Finished() {
			busy++
		}
	}
	return busy
}
