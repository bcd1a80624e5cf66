package spot

import (
	"context"

	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/location"
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
	machine.Go(func() {
		defer close(l.done)
		l.nodes, l.err = m.store.ListNodes(ctx, mesh)
	})
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
	return spotcall.PickMesh(inMesh, l.nodes, l.err)
}

// candidates is spotcall.Candidates: the placement order of the nodes
// that host stableType.
func candidates(nodes []location.VersionedNode, stableType string, instance bool, spotID string) []location.VersionedNode {
	return spotcall.Candidates(nodes, stableType, instance, spotID)
}

// admitCapacity admits one new incarnation on this node as
// spotservice.AdmitCapacity decides (the simulation runs it too). An
// admitted creation on a bounded node holds its pending slot until the
// returned release is called; the slot is taken before the serving
// incarnations are counted, so concurrent creations cannot overshoot.
func (m *Manager) admitCapacity(ctx context.Context) (release func(), err error) {
	draining, c := m.d.Node().Draining(), m.desc.GetCapacity()
	if !spotservice.HoldsSlot(draining, c) {
		if err := spotservice.AdmitCapacity(m.desc.GetNodeRid(), draining, c, 0, 0); err != nil {
			return nil, err
		}
		return func() {}, nil
	}
	pending := m.pending.Add(1)
	release = func() { m.pending.Add(-1) }
	n, err := m.d.ServingCount(ctx)
	if err == nil {
		err = spotservice.AdmitCapacity(m.desc.GetNodeRid(), false, c, n, int(pending)-1)
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}
