package placement

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func units(owner string, n int) []Unit {
	out := make([]Unit, n)
	for i := range out {
		out[i] = Unit{Key: fmt.Sprintf("actor/%s-%d", owner, i), StableType: "t", Owner: owner}
	}
	return out
}

// Balance moves units off the nodes above the mean (by more than the
// margin) to the emptiest node that hosts their kind, never past the mean.
func TestBalanceEvensOutWithoutOvershoot(t *testing.T) {
	nodes := []Node{{Rid: "a", Units: 30}, {Rid: "b", Units: 0}, {Rid: "c", Units: 0}}
	moves := Balance(nodes, units("a", 30), 1, 100)
	to := map[string]int{}
	for _, m := range moves {
		require.Equal(t, "a", m.Unit.Owner)
		to[m.Target]++
	}
	require.Equal(t, map[string]int{"b": 10, "c": 9}, to, "a keeps the mean plus the margin, the others reach at most the mean")

	require.Empty(t, Balance([]Node{{Rid: "a", Units: 11}, {Rid: "b", Units: 9}}, units("a", 11), 1, 100), "within the margin")
	require.Len(t, Balance(nodes, units("a", 30), 1, 3), 3, "at most max")
	require.Empty(t, Balance(nodes[:1], units("a", 30), 1, 100), "one node: nowhere to go")
	require.Empty(t, Balance(nodes, units("b", 5), 1, 100), "units of a node below the mean stay")
}

// A node that cannot host a unit's kind (or is draining) is never its
// target.
func TestBalanceRespectsWhatATargetHosts(t *testing.T) {
	onlyU := func(st string) bool { return st == "u" }
	nodes := []Node{{Rid: "a", Units: 20}, {Rid: "b", Units: 0, Hosts: onlyU}, {Rid: "c", Units: 0, Hosts: func(string) bool { return false }}}
	moves := Balance(nodes, units("a", 20), 1, 100)
	require.Empty(t, moves, "b hosts only u, c nothing")
	page := units("a", 20)
	for i := range page {
		page[i].StableType = "u"
	}
	moves = Balance(nodes, page, 1, 100)
	require.NotEmpty(t, moves)
	for _, m := range moves {
		require.Equal(t, "b", m.Target)
	}
}

// The director is the oldest lifecycle, whatever the listing's order.
func TestElectIsTheOldestLifecycle(t *testing.T) {
	require.Equal(t, "", Elect(nil))
	require.Equal(t, "n2", Elect([]Elector{{"n1", 9}, {"n2", 3}, {"n3", 5}}))
	require.Equal(t, "a", Elect([]Elector{{"b", 3}, {"a", 3}}))
}
