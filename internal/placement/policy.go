package placement

import (
	"math"
	"slices"

	"github.com/roamactors/roam/location"
)

// Node is a live node as selection sees it: how many units it owns (from
// the last full census) and what it hosts.
type Node struct {
	Rid string
	// Units is the number of relocation units it owns.
	Units int
	// Hosts reports whether it can host a unit of stableType (its
	// descriptor lists the kind) and takes new work (serving, not
	// draining).
	Hosts func(stableType string) bool
}

// Unit is a candidate for a move, with the tuple it was selected with.
type Unit struct {
	Ref        location.AuthorityKey
	Key        string // Ref.String()
	StableType string
	Owner      string // its owner node's RID
	OwnerGen   uint64
	ObjectGen  uint64
	SourceGen  uint64 // the owner node's generation
}

// Move is one planned attempt's object and target.
type Move struct {
	Unit   Unit
	Target string
}

// Balance plans moves that even out the number of units per node: a unit
// of a node with more than the mean plus margin goes to the node with the
// fewest that can host it, while that node is below the mean; counts are
// updated as it plans, so it never overshoots. At most max moves; units
// in page order (the caller's rotating page), so no unit starves.
func Balance(nodes []Node, page []Unit, margin float64, max int) []Move {
	if len(nodes) < 2 || max <= 0 {
		return nil
	}
	total := 0
	count := make(map[string]int, len(nodes))
	for _, n := range nodes {
		total += n.Units
		count[n.Rid] = n.Units
	}
	mean := float64(total) / float64(len(nodes))
	high := int(math.Floor(mean + math.Max(margin, 1)))
	var out []Move
	for _, u := range page {
		if len(out) >= max {
			break
		}
		c, live := count[u.Owner]
		if !live || c <= high {
			continue
		}
		best := -1
		for i, n := range nodes {
			if n.Rid == u.Owner || (n.Hosts != nil && !n.Hosts(u.StableType)) {
				continue
			}
			if best < 0 || count[n.Rid] < count[nodes[best].Rid] || (count[n.Rid] == count[nodes[best].Rid] && n.Rid < nodes[best].Rid) {
				best = i
			}
		}
		if best < 0 || float64(count[nodes[best].Rid]) >= math.Floor(mean) {
			continue
		}
		target := nodes[best].Rid
		count[u.Owner]--
		count[target]++
		out = append(out, Move{Unit: u, Target: target})
	}
	return out
}

// Elect is the director among the live nodes: the oldest lifecycle (the
// lowest node generation, then RID). Every node computes the same answer
// from the same listing (docs/PLACEMENT.md §2).
func Elect(nodes []Elector) string {
	if len(nodes) == 0 {
		return ""
	}
	best := slices.MinFunc(nodes, func(a, b Elector) int {
		switch {
		case a.Generation != b.Generation:
			if a.Generation < b.Generation {
				return -1
			}
			return 1
		case a.Rid < b.Rid:
			return -1
		case a.Rid > b.Rid:
			return 1
		}
		return 0
	})
	return best.Rid
}

// Elector is a live node as the election sees it.
type Elector struct {
	Rid        string
	Generation uint64
}
