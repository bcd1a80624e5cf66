package placement

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/roamactors/roam/location"
)

// Edge is sampled traffic from one object to another (docs/PLACEMENT.md
// §5): Weight sampled messages, halved every half-life.
type Edge struct {
	From, To location.AuthorityKey
	// FromNode is the RID of the node the sender was on at its last sample;
	// ToNode the node whose table holds the edge (the receiver is there).
	FromNode, ToNode string
	Weight           float64
}

// Load is an object's sampled load: the messages sampled into it
// (whoever sent them), halved every half-life, on Node (its table's).
type Load struct {
	Key    location.AuthorityKey
	Node   string
	Weight float64
}

// EdgeTable is one node's bounded table of the edges whose receivers it
// hosts, and of its objects' loads. Memory is bounded by Max entries of
// each: a full table halves every
// weight and forgets what falls below half a sample, so the edges that
// carry traffic stay and a one-off sender does not. Safe for concurrent
// use: receivers on many goroutines record into it.
type EdgeTable struct {
	mu       sync.Mutex
	max      int
	halfLife time.Duration
	decayed  time.Time
	edges    map[edgeKey]edgeCount
	loads    map[location.AuthorityKey]float64
}

type edgeKey struct{ from, to location.AuthorityKey }

type edgeCount struct {
	fromNode string
	weight   float64
}

// NewEdgeTable holds at most max edges, halving their weights every
// halfLife.
func NewEdgeTable(max int, halfLife time.Duration) *EdgeTable {
	return &EdgeTable{max: max, halfLife: halfLife, edges: map[edgeKey]edgeCount{}, loads: map[location.AuthorityKey]float64{}}
}

// Record counts one sampled message from (on fromNode) to to.
func (t *EdgeTable) Record(from location.AuthorityKey, fromNode string, to location.AuthorityKey, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decay(now)
	k := edgeKey{from, to}
	c, ok := t.edges[k]
	if !ok && len(t.edges) >= t.max {
		// Edges seen once go first; if every edge is heavier, all weights
		// halve and the lightest go.
		t.forget(2)
		if len(t.edges) >= t.max {
			t.halve(1)
		}
		if len(t.edges) >= t.max {
			return // every edge is heavier than this one's first sample
		}
	}
	c.fromNode, c.weight = fromNode, c.weight+1
	t.edges[k] = c
}

// RecordLoad counts one sampled message into key.
func (t *EdgeTable) RecordLoad(key location.AuthorityKey, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decay(now)
	w, ok := t.loads[key]
	if !ok && len(t.loads) >= t.max {
		forget(t.loads, 2)
		if len(t.loads) >= t.max {
			halve(t.loads, 1)
		}
		if len(t.loads) >= t.max {
			return
		}
	}
	t.loads[key] = w + 1
}

// Loads returns the loads of the objects here(key) still reports hosted,
// in no order, the others forgotten.
func (t *EdgeTable) Loads(here func(location.AuthorityKey) bool, now time.Time) []Load {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decay(now)
	out := make([]Load, 0, len(t.loads))
	for k, w := range t.loads {
		if !here(k) {
			delete(t.loads, k)
			continue
		}
		out = append(out, Load{Key: k, Weight: w})
	}
	return out
}

// Snapshot returns the edges whose receiver here(to) still reports
// hosted, in no order; the others are forgotten (the receiver left, and
// its new node counts its edges from now on). Heaviest orders them.
func (t *EdgeTable) Snapshot(here func(location.AuthorityKey) bool, now time.Time) []Edge {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decay(now)
	out := make([]Edge, 0, len(t.edges))
	for k, c := range t.edges {
		if !here(k.to) {
			delete(t.edges, k)
			continue
		}
		out = append(out, Edge{From: k.from, To: k.to, FromNode: c.fromNode, Weight: c.weight})
	}
	return out
}

// Sample is what a node answers the director: its edges and its objects'
// loads, the heaviest, and the sum of all its objects' loads.
type Sample struct {
	Edges    []Edge
	Loads    []Load
	NodeLoad float64
}

// HeaviestLoads sorts loads, the heaviest first, and keeps the first max.
func HeaviestLoads(loads []Load, max int) []Load {
	slices.SortFunc(loads, func(a, b Load) int { return cmp.Compare(b.Weight, a.Weight) })
	if len(loads) > max {
		loads = loads[:max]
	}
	return loads
}

// Heaviest sorts edges by weight, the heaviest first, and keeps the first
// max.
func Heaviest(edges []Edge, max int) []Edge {
	slices.SortFunc(edges, func(a, b Edge) int { return cmp.Compare(b.Weight, a.Weight) })
	if len(edges) > max {
		edges = edges[:max]
	}
	return edges
}

// Len is the number of edges held.
func (t *EdgeTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.edges)
}

// decay halves every weight once per half-life passed since the last.
func (t *EdgeTable) decay(now time.Time) {
	if t.decayed.IsZero() || now.Before(t.decayed) {
		t.decayed = now // a clock that went back restarts the period
		return
	}
	for ; now.Sub(t.decayed) >= t.halfLife; t.decayed = t.decayed.Add(t.halfLife) {
		if len(t.edges) == 0 && len(t.loads) == 0 {
			t.decayed = now
			return
		}
		t.halve(0.5)
		halve(t.loads, 0.5)
	}
}

// forget drops the edges lighter than floor.
func (t *EdgeTable) forget(floor float64) {
	for k, c := range t.edges {
		if c.weight < floor {
			delete(t.edges, k)
		}
	}
}

// halve halves every weight and forgets those that fall below floor.
func (t *EdgeTable) halve(floor float64) {
	for k, c := range t.edges {
		if c.weight /= 2; c.weight < floor {
			delete(t.edges, k)
		} else {
			t.edges[k] = c
		}
	}
}

// forget drops the loads lighter than floor.
func forget(m map[location.AuthorityKey]float64, floor float64) {
	for k, w := range m {
		if w < floor {
			delete(m, k)
		}
	}
}

// halve halves every load and forgets those that fall below floor.
func halve(m map[location.AuthorityKey]float64, floor float64) {
	for k, w := range m {
		if w /= 2; w < floor {
			delete(m, k)
		} else {
			m[k] = w
		}
	}
}
