package spot

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// selectMesh picks the Mesh a new Spot is first placed on
// (docs/PROTOCOL.md §7.2; PROTOCOL.md §7.5 step 4): the named one
// (NotFound if no node serves it), or the only
// Mesh any node serves (NotConfigured with none, InvalidOperation with
// several). It returns that Mesh's descriptors.
func (m *Manager) selectMesh(ctx context.Context, inMesh string) (string, []location.VersionedNode, error) {
	return pickMesh(inMesh, m.listNodes(ctx, inMesh))
}

// nodeList is one listing of node descriptors: read at once, or started
// ahead of need (listNodesAhead) and waited for.
type nodeList struct {
	mesh  string // "" lists every Mesh
	done  chan struct{}
	nodes []location.VersionedNode
	err   error
}

func (m *Manager) listNodes(ctx context.Context, mesh string) *nodeList {
	l := &nodeList{mesh: mesh}
	l.nodes, l.err = m.store.ListNodes(ctx, mesh)
	return l
}

// listNodesAhead starts listing the descriptors of mesh while the caller
// reads the Spot's authority: a call with Instance intent that finds the
// Spot Missing then places it without a second store round trip in
// series (the listing of a call that finds it Ready is wasted). An
// in-process store lists when asked.
func (m *Manager) listNodesAhead(ctx context.Context, mesh string) *nodeList {
	if m.inProcess || m.cache.maxAge <= 0 {
		// Without a route cache every call resolves, and most find their
		// Spot: listing ahead would cost each of them a listing.
		return nil
	}
	l := &nodeList{mesh: mesh, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.nodes, l.err = m.store.ListNodes(ctx, mesh)
	}()
	return l
}

// nodesOf is the listing of mesh ("" every Mesh): ahead's, if it was
// started for it or for every Mesh, else a new one.
func (m *Manager) nodesOf(ctx context.Context, ahead *nodeList, mesh string) *nodeList {
	if ahead == nil || (ahead.mesh != mesh && ahead.mesh != "") {
		return m.listNodes(ctx, mesh)
	}
	select {
	case <-ahead.done:
	case <-ctx.Done():
		return &nodeList{mesh: mesh, err: ctx.Err()}
	}
	if ahead.err != nil || ahead.mesh == mesh {
		return ahead
	}
	l := &nodeList{mesh: mesh}
	for _, n := range ahead.nodes {
		if n.Node.GetMesh() == mesh {
			l.nodes = append(l.nodes, n)
		}
	}
	return l
}

// pickMesh is selectMesh on a listing of inMesh ("" every Mesh).
func pickMesh(inMesh string, l *nodeList) (string, []location.VersionedNode, error) {
	if l.err != nil {
		return "", nil, storeError("list nodes", l.err)
	}
	nodes := l.nodes
	if inMesh != "" {
		if len(nodes) == 0 {
			return "", nil, fmt.Errorf("%w: mesh %q has no node", roamerr.ErrNotFound, inMesh)
		}
		return inMesh, nodes, nil
	}
	var meshes []string
	for _, n := range nodes {
		if !slices.Contains(meshes, n.Node.GetMesh()) {
			meshes = append(meshes, n.Node.GetMesh())
		}
	}
	switch len(meshes) {
	case 0:
		return "", nil, fmt.Errorf("%w: no object mesh", roamerr.ErrNotConfigured)
	case 1:
		return meshes[0], nodes, nil
	}
	sort.Strings(meshes)
	return "", nil, fmt.Errorf("%w: %d meshes %v; name one with InMesh", roamerr.ErrInvalidOperation, len(meshes), meshes)
}

// instanceType resolves the stable type of a cold activation
// (PROTOCOL.md §7.5 step 5): a named type must be hosted by some node of the Mesh
// (NotFound); an omitted one is the Mesh's only Instance type (NotFound
// with none, InvalidOperation with several).
func instanceType(nodes []location.VersionedNode, named string) (string, error) {
	var types []string
	for _, n := range nodes {
		for _, t := range n.Node.GetInstanceTypes() {
			if !slices.Contains(types, t) {
				types = append(types, t)
			}
		}
	}
	if named != "" {
		if !slices.Contains(types, named) {
			return "", fmt.Errorf("%w: no node of the mesh hosts Instance Spot type %q", roamerr.ErrNotFound, named)
		}
		return named, nil
	}
	switch len(types) {
	case 0:
		return "", fmt.Errorf("%w: the mesh hosts no Instance Spot type", roamerr.ErrNotFound)
	case 1:
		return types[0], nil
	}
	sort.Strings(types)
	return "", fmt.Errorf("%w: the mesh hosts Instance Spot types %v; name one with InstanceSpot(type)", roamerr.ErrInvalidOperation, types)
}

// candidates are the serving nodes that host stableType (as an Instance
// Spot type when instance is set), in placement-weight order (a node of
// weight 0 counts as 1). With a Spot ID the order is a function of the ID
// (weighted rendezvous hashing): every caller sends the cold activations
// of one ID to the same first target, so one caller's calls to a Missing
// Spot keep their order (one connection, the target's per-ID queue) and
// concurrent first messages rarely race. Without one it is drawn at random.
func candidates(nodes []location.VersionedNode, stableType string, instance bool, spotID string) []location.VersionedNode {
	var out []location.VersionedNode
	for _, n := range nodes {
		types := n.Node.GetStableTypes()
		if instance {
			types = n.Node.GetInstanceTypes()
		}
		if n.Node.GetStatus() == messages.NodeStatus_NODE_STATUS_SERVING && slices.Contains(types, stableType) {
			out = append(out, n)
		}
	}
	if spotID != "" {
		score := func(n location.VersionedNode) float64 {
			h := fnv.New64a()
			h.Write([]byte(spotID))
			h.Write([]byte{0})
			h.Write([]byte(n.Node.GetNodeRid()))
			u := (float64(mix64(h.Sum64())>>11) + 0.5) / (1 << 53) // in (0, 1)
			return float64(weight(n)) / -math.Log(u)
		}
		slices.SortStableFunc(out, func(a, b location.VersionedNode) int { return cmp.Compare(score(b), score(a)) })
		return out
	}
	// Weighted order without replacement: each pick is proportional to
	// weight among the rest.
	ordered := make([]location.VersionedNode, 0, len(out))
	for len(out) > 0 {
		total := 0
		for _, n := range out {
			total += weight(n)
		}
		r := rand.IntN(total)
		for i, n := range out {
			if r -= weight(n); r < 0 {
				ordered = append(ordered, n)
				out = slices.Delete(out, i, i+1)
				break
			}
		}
	}
	return ordered
}

// mix64 is SplitMix64's finalizer: FNV alone leaves the top bits of
// hashes that differ in their last byte nearly equal.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func weight(n location.VersionedNode) int { return max(int(n.Node.GetWeight()), 1) }

// admitCapacity admits one new incarnation on this node unless it is
// draining (ErrNodeDraining) or its
// Capacity (0: unbounded) is used up by the incarnations it serves plus
// the creations in progress here (PROTOCOL.md §7.2, placement). An
// admitted creation holds its pending slot until the
// returned release is called, so concurrent creations cannot overshoot.
func (m *Manager) admitCapacity(ctx context.Context) (release func(), err error) {
	if m.d.Node().Draining() {
		// Other nodes' placement skips a DRAINING descriptor; this is for
		// what was sent before they saw it (passed on like a full node's).
		return nil, fmt.Errorf("%w: %w: node %s takes no new Spots", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, m.desc.GetNodeRid())
	}
	c := m.desc.GetCapacity()
	if c == 0 {
		return func() {}, nil
	}
	pending := m.pending.Add(1)
	release = func() { m.pending.Add(-1) }
	n, err := m.d.ServingCount(ctx)
	if err != nil {
		release()
		return nil, err
	}
	if n+int(pending) > int(c) {
		release()
		return nil, fmt.Errorf("%w: node %s hosts %d and creates %d of %d", roamerr.ErrCapacityExceeded, m.desc.GetNodeRid(), n, pending-1, c)
	}
	return release, nil
}
