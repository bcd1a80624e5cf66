package nodesim

import (
	"fmt"
	"testing"

	"github.com/roamactors/roam/internal/simkit"
)

// Real nodes with capacity slots, each running the placement director,
// under random store cuts, store outages, moves, a stop in a rejoin and a
// drain with a restart, and moves of a SpotWide User Spot with its
// members, Joins into it and a leave, in logical time: every Stop ends
// within 15 s of real time with the rejoin it cut short; once the faults
// stop, every node serves again (rejoined when its lease ended), every
// Spot, the SpotWide one among them, and every Actor answers through every
// node, the SpotWide Spot's members all live on its owner and its member
// count is exact, every node's slots are its objects', and the elected
// director completes two passes, one counting every unit, within four
// TTLs; nothing is handled twice (but a cold activation's first message
// when its owner ended before its recovery pointer went, docs/FAULTS.md),
// every answered call was handled once, every error is typed.
// NODESIM_SCHEDULES sets the number of seeds (default 3), NODESIM_SEED the
// first.
// Reference: docs/PROTOCOL.md §3.4 (owner leases), §5.15 (SpotWide), §7.10
// (reactivation, Joins), §7.12 (capacity slots), §10 (one owner at a
// time); docs/FAULTS.md.
func TestFaultSchedulesOnRealNodes(t *testing.T) {
	n, seed0 := simkit.EnvInt("NODESIM_SCHEDULES", 3), simkit.EnvInt("NODESIM_SEED", 1)
	for seed := seed0; seed < seed0+n; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			w := New(t, uint64(seed), Config{})
			w.Run()
			t.Logf("schedule:\n%s", w.Log())
		})
	}
}
