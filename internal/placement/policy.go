package placement

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
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

// CoLocation configures communication-aware co-location
// (docs/PLACEMENT.md §5): every node samples who sends to whom, and the
// director moves objects that talk onto one node, as idle moves only.
type CoLocation struct {
	// Enabled samples on the node and, on the director, plans moves from
	// the samples. Default false.
	Enabled bool
	// SampleEvery: one message in SampleEvery sent from a relocatable
	// object is stamped with its sender. Default 16.
	SampleEvery int
	// Hysteresis: an object moves only if its traffic with the target's
	// objects exceeds that with its own node's by this fraction, so an
	// object between two groups does not go back and forth. Default 0.5.
	Hysteresis float64
	// MinGain is the least cut in sampled messages a move must bring.
	// Default 4.
	MinGain float64
	// Slack is how far above the mean number of units a move may fill its
	// target, as a fraction of the mean (balance against co-location);
	// two units above the mean are always allowed. Default 0.1.
	Slack float64
	// TableSize bounds each node's edge table. Default 16,384 edges.
	TableSize int
	// HalfLife: each node halves its edges' weights this often, so the
	// samples follow the traffic as it changes. Default 1 min.
	HalfLife time.Duration
}

// WithDefaults fills the zero fields.
func (c CoLocation) WithDefaults() CoLocation {
	if c.SampleEvery == 0 {
		c.SampleEvery = 16
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = 0.5
	}
	if c.MinGain == 0 {
		c.MinGain = 4
	}
	if c.Slack == 0 {
		c.Slack = 0.1
	}
	if c.TableSize == 0 {
		c.TableSize = 16384
	}
	if c.HalfLife == 0 {
		c.HalfLife = time.Minute
	}
	return c
}

// Validate reports an InvalidOperation for values that cannot work
// (after WithDefaults).
func (c CoLocation) Validate() error {
	if c.SampleEvery < 1 || c.Hysteresis < 0 || c.MinGain < 0 || c.Slack < 0 || c.TableSize < 1 || c.HalfLife <= 0 {
		return fmt.Errorf("%w: co-location config %+v", roamerr.ErrInvalidOperation, c)
	}
	return nil
}

// Placed is a planned move: the object, its node, its target, and the
// sampled traffic the move makes local minus what it makes remote (or the
// load it moves).
type Placed struct {
	Key      location.AuthorityKey
	From, To string
	Gain     float64
	// With are the partners on To that the move is for, the heaviest first
	// (at most three; co-location only): where they are comes from samples,
	// which may be older than their last move, so the director checks them
	// in the store before it asks for the move.
	With []location.AuthorityKey
	// Partners are the object's heaviest partners wherever the samples put
	// them (at most eight; co-location only), with their weights: the
	// director reads where they are in the store and asks for the move only
	// if the target still wins by the hysteresis. A partner the samples
	// place elsewhere may already have come to this object's node (the
	// sample named where it was), and then moving would split the two.
	Partners []Partner
}

// Partner is one partner of a planned object and the weight of their
// traffic.
type Partner struct {
	Key    location.AuthorityKey
	Weight float64
}

// movableAlone: the kinds the director moves (a User Spot stays where it
// was created; its members talk to it where it is).
func movableAlone(k location.Kind) bool {
	return k == location.KindActor || k == location.KindInstanceSpot
}

// CoLocate plans moves that put objects that talk onto one node
// (docs/PLACEMENT.md §5). An object moves to the node whose objects it
// talks with most, if that traffic exceeds its traffic with its own
// node's objects by the hysteresis and the cut is at least MinGain, and
// the target stays within Slack of the mean number of units. Objects are
// taken by gain, the largest first, and each plan sees the ones before
// it, so a group converges on one node in one round instead of its
// members swapping places. skip: objects not to move (cooling down).
// grouped: every object with traffic of at least MinGain, which balance
// by count leaves to co-location.
func CoLocate(nodes []Node, edges []Edge, c CoLocation, skip func(location.AuthorityKey) bool, most int) (plan []Placed, grouped map[location.AuthorityKey]bool) {
	c = c.WithDefaults()
	count := map[string]int{}
	total := 0
	for _, n := range nodes {
		count[n.Rid] = n.Units
		total += n.Units
	}
	grouped = map[location.AuthorityKey]bool{}
	if len(nodes) < 2 || len(edges) == 0 {
		return nil, grouped
	}
	// A target may own up to the mean plus the slack, and at least two
	// more than the mean: a few units cannot pair up otherwise.
	mean := float64(total) / float64(len(nodes))
	limit := max(int(math.Floor(mean*(1+c.Slack))), int(math.Floor(mean))+2)
	// Where each object is: the node whose table has it as a receiver
	// knows; else where it sent from at its last sample.
	loc := map[location.AuthorityKey]string{}
	for _, e := range edges {
		loc[e.To] = e.ToNode
	}
	talk := map[location.AuthorityKey]map[location.AuthorityKey]float64{}
	add := func(a, b location.AuthorityKey, w float64) {
		m := talk[a]
		if m == nil {
			m = map[location.AuthorityKey]float64{}
			talk[a] = m
		}
		m[b] += w
	}
	for _, e := range edges {
		if _, ok := loc[e.From]; !ok {
			loc[e.From] = e.FromNode
		}
		if e.From != e.To {
			add(e.From, e.To, e.Weight)
			add(e.To, e.From, e.Weight)
		}
	}
	best := func(k location.AuthorityKey) (string, float64) {
		by := map[string]float64{}
		for p, w := range talk[k] {
			by[loc[p]] += w
		}
		here := by[loc[k]]
		to, most := "", 0.0
		for n, w := range by {
			if _, live := count[n]; !live || n == loc[k] || count[n] >= limit {
				continue
			}
			if w > most || (w == most && n < to) {
				to, most = n, w
			}
		}
		if to == "" || most < (1+c.Hysteresis)*here || most-here < c.MinGain {
			return "", 0
		}
		return to, most - here
	}
	type cand struct {
		key  location.AuthorityKey
		gain float64
	}
	var cands []cand
	for k, ps := range talk {
		w := 0.0
		for _, v := range ps {
			w += v
		}
		if w >= c.MinGain {
			grouped[k] = true
		}
		if _, live := count[loc[k]]; !live || !movableAlone(k.Kind) || (skip != nil && skip(k)) {
			continue
		}
		if _, g := best(k); g > 0 {
			cands = append(cands, cand{k, g})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.gain != b.gain {
			return cmp.Compare(b.gain, a.gain)
		}
		return cmp.Compare(a.key.String(), b.key.String())
	})
	for _, cd := range cands {
		if len(plan) >= most {
			break
		}
		to, g := best(cd.key) // again: the plans before it may have changed it
		if to == "" {
			continue
		}
		from := loc[cd.key]
		var with []location.AuthorityKey
		for p := range talk[cd.key] {
			if loc[p] == to {
				with = append(with, p)
			}
		}
		slices.SortFunc(with, func(a, b location.AuthorityKey) int {
			if wa, wb := talk[cd.key][a], talk[cd.key][b]; wa != wb {
				return cmp.Compare(wb, wa)
			}
			return cmp.Compare(a.String(), b.String())
		})
		var partners []Partner
		for p, w := range talk[cd.key] {
			partners = append(partners, Partner{Key: p, Weight: w})
		}
		slices.SortFunc(partners, func(a, b Partner) int {
			if a.Weight != b.Weight {
				return cmp.Compare(b.Weight, a.Weight)
			}
			return cmp.Compare(a.Key.String(), b.Key.String())
		})
		plan = append(plan, Placed{Key: cd.key, From: from, To: to, Gain: g, With: with[:min(len(with), 3)],
			Partners: partners[:min(len(partners), 8)]})
		loc[cd.key] = to
		count[from]--
		count[to]++
	}
	return plan, grouped
}

// Balance policies (Config.BalanceBy).
const (
	// BalanceByCount evens out the number of units per node.
	BalanceByCount = "count"
	// BalanceByLoad evens out the sampled messages per node.
	BalanceByLoad = "load"
)

// LoadNode is a live node as balance by load sees it: the sum of its
// objects' sampled loads.
type LoadNode struct {
	Rid  string
	Load float64
}

// BalanceLoad plans moves that even out the nodes' sampled loads: from
// each node above the mean by more than margin (a fraction of the mean),
// the heaviest units that fit go to the least loaded node, each only if
// that node then carries less than the source did (the heavier of the two
// gets lighter, so a move never just shifts the imbalance, and the unit
// would not come back); loads are updated as it plans. skip: units not to move
// (cooling down, co-location's). At most most moves.
func BalanceLoad(nodes []LoadNode, loads []Load, margin float64, skip func(location.AuthorityKey) bool, most int) []Placed {
	if len(nodes) < 2 || most <= 0 {
		return nil
	}
	load := map[string]float64{}
	total := 0.0
	for _, n := range nodes {
		load[n.Rid] = n.Load
		total += n.Load
	}
	mean := total / float64(len(nodes))
	if mean <= 0 {
		return nil
	}
	high := mean * (1 + margin)
	byNode := map[string][]Load{}
	for _, l := range loads {
		if _, live := load[l.Node]; live && movableAlone(l.Key.Kind) && l.Weight > 0 && (skip == nil || !skip(l.Key)) {
			byNode[l.Node] = append(byNode[l.Node], l)
		}
	}
	over := slices.Clone(nodes)
	slices.SortFunc(over, func(a, b LoadNode) int { return cmp.Compare(b.Load, a.Load) })
	var out []Placed
	for _, src := range over {
		units := byNode[src.Rid]
		slices.SortFunc(units, func(a, b Load) int {
			if a.Weight != b.Weight {
				return cmp.Compare(b.Weight, a.Weight)
			}
			return cmp.Compare(a.Key.String(), b.Key.String())
		})
		for _, u := range units {
			if load[src.Rid] <= high || len(out) >= most {
				break
			}
			to := ""
			for _, n := range nodes {
				if n.Rid != src.Rid && (to == "" || load[n.Rid] < load[to] || (load[n.Rid] == load[to] && n.Rid < to)) {
					to = n.Rid
				}
			}
			if to == "" || load[to]+u.Weight >= load[src.Rid] {
				continue // it would only move the imbalance: a lighter one may fit
			}
			load[src.Rid] -= u.Weight
			load[to] += u.Weight
			out = append(out, Placed{Key: u.Key, From: src.Rid, To: to, Gain: u.Weight})
		}
	}
	return out
}
