package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
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

func edge(from, fromNode, to, toNode string, w float64) Edge {
	return Edge{From: actor(from), FromNode: fromNode, To: actor(to), ToNode: toNode, Weight: w}
}

func threeNodes(units int) []Node {
	return []Node{{Rid: "n1", Units: units}, {Rid: "n2", Units: units}, {Rid: "n3", Units: units}}
}

// Of a pair split across two nodes, one moves to the other, not both
// past each other.
func TestCoLocateMovesOneOfAPair(t *testing.T) {
	edges := []Edge{edge("a", "n1", "b", "n2", 10), edge("b", "n2", "a", "n1", 10)}
	plan, grouped := CoLocate(threeNodes(10), edges, CoLocation{}, nil, 100)
	require.Len(t, plan, 1)
	require.Equal(t, Placed{Key: actor("a"), From: "n1", To: "n2", Gain: 20, With: []location.AuthorityKey{actor("b")},
		Partners: []Partner{{actor("b"), 20}}}, plan[0])
	require.True(t, grouped[actor("a")] && grouped[actor("b")])
}

// Hysteresis: an object that talks with another node's objects only a
// little more than with its own stays; the cut must also reach MinGain.
func TestCoLocateHysteresis(t *testing.T) {
	// x on n1 talks 10 with y (n1) and 12 with z (n2): stays.
	edges := []Edge{edge("x", "n1", "y", "n1", 10), edge("x", "n1", "z", "n2", 12)}
	skipYZ := func(k location.AuthorityKey) bool { return k != actor("x") }
	plan, _ := CoLocate(threeNodes(10), edges, CoLocation{}, skipYZ, 100)
	require.Empty(t, plan)
	edges[1].Weight = 15 // 1.5 × 10: moves
	plan, _ = CoLocate(threeNodes(10), edges, CoLocation{}, skipYZ, 100)
	require.Equal(t, []Placed{{Key: actor("x"), From: "n1", To: "n2", Gain: 5, With: []location.AuthorityKey{actor("z")},
		Partners: []Partner{{actor("z"), 15}, {actor("y"), 10}}}}, plan)
	plan, _ = CoLocate(threeNodes(10), []Edge{edge("p", "n1", "q", "n2", 3)}, CoLocation{}, nil, 100)
	require.Empty(t, plan, "a cut below MinGain (4)")
}

// A target already above the mean by the slack takes nothing; a User Spot
// and a cooling object never move.
func TestCoLocateRespectsCapacityKindsAndCooldown(t *testing.T) {
	edges := []Edge{edge("a", "n1", "b", "n2", 10)}
	nodes := []Node{{Rid: "n1", Units: 10}, {Rid: "n2", Units: 12}, {Rid: "n3", Units: 8}} // limit max(floor(10×1.1), 10+2) = 12
	plan, _ := CoLocate(nodes, edges, CoLocation{}, func(k location.AuthorityKey) bool { return k == actor("b") }, 100)
	require.Empty(t, plan, "n2 is full and b is cooling")
	plan, _ = CoLocate(nodes, edges, CoLocation{}, nil, 100)
	require.Equal(t, []Placed{{Key: actor("b"), From: "n2", To: "n1", Gain: 10, With: []location.AuthorityKey{actor("a")},
		Partners: []Partner{{actor("a"), 10}}}}, plan, "b may go to a's node")
	spot := Edge{From: location.Key(location.KindUserSpot, "room"), FromNode: "n2", To: actor("u"), ToNode: "n1", Weight: 10}
	plan, _ = CoLocate(threeNodes(10), []Edge{spot}, CoLocation{}, nil, 100)
	require.Equal(t, []Placed{{Key: actor("u"), From: "n1", To: "n2", Gain: 10, With: []location.AuthorityKey{location.Key(location.KindUserSpot, "room")},
		Partners: []Partner{{location.Key(location.KindUserSpot, "room"), 10}}}}, plan, "the User Spot stays; its member goes to it")
}

// Clusters of 2–10 objects placed at random on three nodes, talking only
// within their cluster: applying the plans round after round, no object
// goes back to a node it left and few move twice, the plans end, the remote traffic falls by
// far more than half, and no node ends above the slack.
func TestCoLocateConvergesWithoutPingPong(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := []string{"n1", "n2", "n3"}
	where := map[location.AuthorityKey]string{}
	var clusters [][]location.AuthorityKey
	for i := 0; len(where) < 1500; i++ {
		var c []location.AuthorityKey
		for j := range 2 + rng.IntN(9) {
			k := actor(fmt.Sprintf("c%d-%d", i, j))
			where[k] = nodes[rng.IntN(3)]
			c = append(c, k)
		}
		clusters = append(clusters, c)
	}
	edgesNow := func() (out []Edge, remote, total float64) {
		for _, c := range clusters {
			for _, a := range c {
				for _, b := range c {
					if a != b {
						out = append(out, Edge{From: a, FromNode: where[a], To: b, ToNode: where[b], Weight: 8})
						total += 8
						if where[a] != where[b] {
							remote += 8
						}
					}
				}
			}
		}
		return out, remote, total
	}
	census := func() []Node {
		n := map[string]int{}
		for _, w := range where {
			n[w]++
		}
		return []Node{{Rid: "n1", Units: n["n1"]}, {Rid: "n2", Units: n["n2"]}, {Rid: "n3", Units: n["n3"]}}
	}
	_, before, total := edgesNow()
	moved := map[location.AuthorityKey]int{}
	left := map[location.AuthorityKey]map[string]bool{}
	rounds := 0
	for ; rounds < 50; rounds++ {
		edges, _, _ := edgesNow()
		plan, _ := CoLocate(census(), edges, CoLocation{}, nil, 128)
		if len(plan) == 0 {
			break
		}
		for _, p := range plan {
			require.Equal(t, where[p.Key], p.From)
			require.False(t, left[p.Key][p.To], "%v goes back to a node it left", p.Key)
			if left[p.Key] == nil {
				left[p.Key] = map[string]bool{}
			}
			left[p.Key][p.From] = true
			where[p.Key] = p.To
			moved[p.Key]++
		}
	}
	require.Less(t, rounds, 50, "the plans end")
	moves := 0
	for _, n := range moved {
		moves += n
	}
	_, after, _ := edgesNow()
	t.Logf("remote fraction %.2f → %.2f in %d rounds, %d objects moved, %d moves", before/total, after/total, rounds, len(moved), moves)
	require.Less(t, float64(moves), 1.1*float64(len(moved)), "few objects move twice (following their group), none back")
	require.Less(t, after, before/4)
	for _, n := range census() {
		require.LessOrEqual(t, n.Units, 550, "within the slack of the mean (500)")
	}
}

// Balance by load moves the heaviest units that fit from the nodes above
// the mean (by more than the margin) to the least loaded, the target
// ending below what the source had; skipped units and User Spots stay.
func TestBalanceLoadEvensOutWithoutOvershoot(t *testing.T) {
	nodes := []LoadNode{{"a", 100}, {"b", 10}, {"c", 10}} // mean 40
	loads := []Load{{actor("w40"), "a", 40}, {actor("w30"), "a", 30}, {actor("w20"), "a", 20}, {actor("w10"), "a", 10},
		{actor("b1"), "b", 10}, {actor("c1"), "c", 10}}
	plan := BalanceLoad(nodes, loads, 0.2, nil, 100)
	got := map[string]float64{"a": 100, "b": 10, "c": 10}
	for _, p := range plan {
		w := 0.0
		for _, l := range loads {
			if l.Key == p.Key {
				w = l.Weight
			}
		}
		got[p.From] -= w
		got[p.To] += w
		require.Less(t, got[p.To], got[p.From]+w, "the target ends below what the source had")
	}
	for n, l := range got {
		require.LessOrEqual(t, l, 48.0, "%s ends within the margin: %v", n, got)
	}

	require.Empty(t, BalanceLoad([]LoadNode{{"a", 46}, {"b", 40}, {"c", 34}}, loads, 0.2, nil, 100), "within the margin")
	require.Empty(t, BalanceLoad(nodes, loads, 0.2, func(location.AuthorityKey) bool { return true }, 100), "all skipped")
	spot := []Load{{location.Key(location.KindUserSpot, "room"), "a", 30}}
	require.Empty(t, BalanceLoad(nodes, spot, 0.2, nil, 100), "a User Spot stays")
	require.Len(t, BalanceLoad(nodes, loads, 0.2, nil, 1), 1, "at most most")
}
