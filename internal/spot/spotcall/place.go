package spotcall

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// PickMesh picks the Mesh a new Spot is first placed on
// (docs/PROTOCOL.md §7.2; §7.5 step 4) from a listing of inMesh's
// descriptors ("" every Mesh) that answered nodes or listErr: the named
// one (NotFound if no node serves it), or the only Mesh any node serves
// (NotConfigured with none, InvalidOperation with several). It returns
// that Mesh's descriptors.
func PickMesh(inMesh string, nodes []location.VersionedNode, listErr error) (string, []location.VersionedNode, error) {
	if listErr != nil {
		return "", nil, activation.StoreError("list nodes", listErr)
	}
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

// InstanceType resolves the stable type of a cold activation
// (PROTOCOL.md §7.5 step 5): a named type must be hosted by some node of
// the Mesh (NotFound); an omitted one is the Mesh's only Instance type
// (NotFound with none, InvalidOperation with several).
func InstanceType(nodes []location.VersionedNode, named string) (string, error) {
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

// Candidates are the serving nodes that host stableType (as an Instance
// Spot type when instance is set), in placement-weight order (a node of
// weight 0 counts as 1). With a Spot ID the order is a function of the
// ID (weighted rendezvous hashing): every caller sends the cold
// activations of one ID to the same first target, so one caller's calls
// to a Missing Spot keep their order (one connection, the target's per-ID
// queue) and concurrent first messages rarely race. Without one it is
// drawn at random.
func Candidates(nodes []location.VersionedNode, stableType string, instance bool, spotID string) []location.VersionedNode {
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

// Target selects the target of a Place or Reactivate plan (PROTOCOL.md
// §7.5 steps 4–7) from the listing of p.Mesh ("" every Mesh) and returns
// it with the SpotActivation it is sent (Complete fills in the rest). A
// reactivation that finds no live node of its stored Mesh, or none that
// hosts its type, is Unavailable: transient (every lease ended after a
// store outage, say; the nodes rejoin), unlike a Mesh or type a caller
// named that nobody serves.
func Target(p Plan, spotID string, nodes []location.VersionedNode, listErr error) (location.VersionedNode, *messages.SpotActivation, error) {
	reactivation := p.Way == Reactivate
	mesh, nodes, err := PickMesh(p.Mesh, nodes, listErr)
	if err != nil {
		if reactivation && errors.Is(err, roamerr.ErrNotFound) {
			return location.VersionedNode{}, nil, fmt.Errorf("%w: no live node of mesh %q to reactivate Spot %q (%v)", roamerr.ErrUnavailable, p.Mesh, spotID, err)
		}
		return location.VersionedNode{}, nil, err
	}
	stableType, err := InstanceType(nodes, p.StableType)
	if err != nil {
		if reactivation && errors.Is(err, roamerr.ErrNotFound) {
			return location.VersionedNode{}, nil, fmt.Errorf("%w: no live node hosts %q to reactivate Spot %q", roamerr.ErrUnavailable, stableType, spotID)
		}
		return location.VersionedNode{}, nil, err
	}
	cands := Candidates(nodes, stableType, true, spotID)
	if len(cands) == 0 {
		return location.VersionedNode{}, nil, fmt.Errorf("%w: no serving node hosts Instance Spot type %q", roamerr.ErrUnavailable, stableType)
	}
	target := cands[0]
	return target, &messages.SpotActivation{
		TargetMesh: mesh, TargetNodeRid: target.Node.GetNodeRid(), TargetNodeGeneration: target.Node.GetNodeGeneration(),
		DescriptorVersion: uint64(target.Version), StableType: stableType, SourceReadMissing: !reactivation,
	}, nil
}
