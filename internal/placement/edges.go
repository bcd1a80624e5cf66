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
// each: a full table halves every weight and forgets what falls below
// half a sample, so the edges that carry traffic stay and a one-off sender
// does not (a table of 1,024 entries or more is split by receiver into 16
// parts of Max/16, each bounded so on its own). Safe for concurrent use:
// receivers on many goroutines record into it.
type EdgeTable struct {
	halfLife time.Duration
	// shards split the table by receiver: every object of a node records
	// its samples here from its own turn, and with one lock a saturated
	// node's receivers queued on it (and on the director's read of the
	// whole table). A small table is one shard, so that its bound is exact.
	shards []edgeShard
}

type edgeShard struct {
	mu      sync.Mutex
	max     int
	decayed time.Time
	edges   map[edgeKey]edgeCount
	loads   map[location.AuthorityKey]float64
	_       [64]byte // keeps two shards' locks off one cache line
}

type edgeKey struct{ from, to location.AuthorityKey }

type edgeCount struct {
	fromNode string
	weight   float64
}

// edgeShards is the shards of a table of at least shardedTable entries.
const (
	edgeShards   = 16
	shardedTable = 1024
)

// NewEdgeTable holds at most max edges, halving their weights every
// halfLife.
func NewEdgeTable(max int, halfLife time.Duration) *EdgeTable {
	n := 1
	if max >= shardedTable {
		n = edgeShards
	}
	t := &EdgeTable{halfLife: halfLife, shards: make([]edgeShard, n)}
	for i := range t.shards {
		t.shards[i] = edgeShard{max: max / n, edges: map[edgeKey]edgeCount{}, loads: map[location.AuthorityKey]float64{}}
	}
	return t
}

// shard is the shard of receiver key's edges and load.
func (t *EdgeTable) shard(key location.AuthorityKey) *edgeShard {
	if len(t.shards) == 1 {
		return &t.shards[0]
	}
	h := uint32(2166136261) ^ uint32(key.Kind) // FNV-1a, inline
	for i := 0; i < len(key.ID); i++ {
		h ^= uint32(key.ID[i])
		h *= 16777619
	}
	return &t.shards[h%uint32(len(t.shards))]
}

// Record counts one sampled message from (on fromNode) to to.
func (t *EdgeTable) Record(from location.AuthorityKey, fromNode string, to location.AuthorityKey, now time.Time) {
	s := t.shard(to)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decay(now, t.halfLife)
	k := edgeKey{from, to}
	c, ok := s.edges[k]
	if !ok && len(s.edges) >= s.max {
		// Edges seen once go first; if every edge is heavier, all weights
		// halve and the lightest go.
		s.forget(2)
		if len(s.edges) >= s.max {
			s.halve(1)
		}
		if len(s.edges) >= s.max {
			return // every edge is heavier than this one's first sample
		}
	}
	c.fromNode, c.weight = fromNode, c.weight+1
	s.edges[k] = c
}

// RecordLoad counts one sampled message into key.
func (t *EdgeTable) RecordLoad(key location.AuthorityKey, now time.Time) {
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decay(now, t.halfLife)
	w, ok := s.loads[key]
	if !ok && len(s.loads) >= s.max {
		forget(s.loads, 2)
		if len(s.loads) >= s.max {
			halve(s.loads, 1)
		}
		if len(s.loads) >= s.max {
			return
		}
	}
	s.loads[key] = w + 1
}

// Loads returns the loads of the objects here(key) still reports hosted,
// in no order, the others forgotten.
func (t *EdgeTable) Loads(here func(location.AuthorityKey) bool, now time.Time) []Load {
	var out []Load
	t.eachShard(now, func(s *edgeShard) {
		for k, w := range s.loads {
			if !here(k) {
				delete(s.loads, k)
				continue
			}
			out = append(out, Load{Key: k, Weight: w})
		}
	})
	return out
}

// Snapshot returns the edges whose receiver here(to) still reports
// hosted, in no order; the others are forgotten (the receiver left, and
// its new node counts its edges from now on). Heaviest orders them.
func (t *EdgeTable) Snapshot(here func(location.AuthorityKey) bool, now time.Time) []Edge {
	var out []Edge
	t.eachShard(now, func(s *edgeShard) {
		for k, c := range s.edges {
			if !here(k.to) {
				delete(s.edges, k)
				continue
			}
			out = append(out, Edge{From: k.from, To: k.to, FromNode: c.fromNode, Weight: c.weight})
		}
	})
	return out
}

// eachShard runs f on every shard in turn, under its lock, decayed to now
// (one shard at a time: the recorders of the others go on meanwhile).
func (t *EdgeTable) eachShard(now time.Time, f func(*edgeShard)) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.decay(now, t.halfLife)
		f(s)
		s.mu.Unlock()
	}
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
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.edges)
		s.mu.Unlock()
	}
	return n
}

// decay halves every weight once per half-life passed since the last.
func (s *edgeShard) decay(now time.Time, halfLife time.Duration) {
	if s.decayed.IsZero() || now.Before(s.decayed) {
		s.decayed = now // a clock that went back restarts the period
		return
	}
	for ; now.Sub(s.decayed) >= halfLife; s.decayed = s.decayed.Add(halfLife) {
		if len(s.edges) == 0 && len(s.loads) == 0 {
			s.decayed = now
			return
		}
		s.halve(0.5)
		halve(s.loads, 0.5)
	}
}

// forget drops the edges lighter than floor.
func (s *edgeShard) forget(floor float64) {
	for k, c := range s.edges {
		if c.weight < floor {
			delete(s.edges, k)
		}
	}
}

// halve halves every weight and forgets those that fall below floor.
func (s *edgeShard) halve(floor float64) {
	for k, c := range s.edges {
		if c.weight /= 2; c.weight < floor {
			delete(s.edges, k)
		} else {
			s.edges[k] = c
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
