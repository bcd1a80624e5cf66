package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/roamerr"
)

// ErrNotMember: a peer that claims to be a node of the mesh is not one
// the Location Store knows at that address and generation — an outsider,
// or a node whose lease has ended. It matches roamerr.ErrPermissionDenied.
var ErrNotMember = fmt.Errorf("%w: not a live member of the mesh", roamerr.ErrPermissionDenied)

// members answers "is this peer a live node of the cluster?" (of any mesh
// of the Location Store) from the store's
// node descriptors: a descriptor exists only while its owner lease lives,
// and names the node's RID, generation and remote address. Control
// messages are accepted only from such a peer; without mutual TLS the
// address is what the peer declares, so the check is that the answer to
// a query goes to a member, never to whoever asked (docs/SECURITY.md).
type members struct {
	store location.Store
	mesh  string

	mu sync.Mutex
	// seen: address → the descriptor last read for it, and when. A hit
	// younger than memberFresh is trusted without a store read.
	seen map[string]memberSeen
	// listed is when the mesh was last listed after a miss: misses list
	// at most every listEvery, so a stream of unknown addresses costs the
	// store one list per interval, not one per message.
	listed time.Time
}

type memberSeen struct {
	desc *location.NodeDescriptor
	at   time.Time
}

const (
	memberFresh = time.Second
	listEvery   = 250 * time.Millisecond
)

func newMembers(store location.Store, mesh string) *members {
	return &members{store: store, mesh: mesh, seen: map[string]memberSeen{}}
}

// at returns the live member at address, or ErrNotMember.
func (m *members) at(ctx context.Context, address string) (*location.NodeDescriptor, error) {
	now := time.Now()
	m.mu.Lock()
	s, ok := m.seen[address]
	mayList := now.Sub(m.listed) >= listEvery
	if ok && now.Sub(s.at) < memberFresh {
		m.mu.Unlock()
		return s.desc, nil
	}
	if ok {
		// Re-read the one descriptor we know: cheaper than a list, and
		// never rate-limited (a member must not be refused for a busy
		// outsider).
		m.mu.Unlock()
		d, err := m.read(ctx, s.desc.GetNodeRid(), s.desc.GetNodeGeneration(), address)
		if err == nil || !errors.Is(err, ErrNotMember) {
			return d, err
		}
		m.mu.Lock()
		delete(m.seen, address)
	}
	if !mayList {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: no node is known at %s, and the nodes were listed moments ago", roamerr.ErrUnavailable, address)
	}
	m.listed = now
	m.mu.Unlock()
	nodes, err := m.store.ListNodes(ctx, "") // every mesh: a call may come from another mesh's node
	if err != nil {
		return nil, fmt.Errorf("%w: list the mesh's nodes: %w", roamerr.ErrUnavailable, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var found *location.NodeDescriptor
	for _, n := range nodes {
		m.seen[n.Node.GetAddress()] = memberSeen{desc: n.Node, at: now}
		if n.Node.GetAddress() == address {
			found = n.Node
		}
	}
	if found == nil {
		return nil, fmt.Errorf("%w: no node is at %s", ErrNotMember, address)
	}
	return found, nil
}

// verify checks that the node lifecycle (rid, generation) is a live
// member of the mesh at address.
func (m *members) verify(ctx context.Context, rid string, generation uint64, address string) error {
	m.mu.Lock()
	s, ok := m.seen[address]
	m.mu.Unlock()
	if ok && time.Since(s.at) < memberFresh && s.desc.GetNodeRid() == rid && s.desc.GetNodeGeneration() == generation {
		return nil
	}
	_, err := m.read(ctx, rid, generation, address)
	if errors.Is(err, errOtherMesh) {
		// Not of this mesh: a node of another mesh of the store, found by
		// its address.
		d, err := m.at(ctx, address)
		if err != nil {
			return err
		}
		if d.GetNodeRid() != rid || d.GetNodeGeneration() != generation {
			return fmt.Errorf("%w: node %s is not that lifecycle at %s", ErrNotMember, rid, address)
		}
		return nil
	}
	return err
}

// errOtherMesh: no descriptor of the RID in this node's mesh.
var errOtherMesh = fmt.Errorf("%w: not of this mesh", ErrNotMember)

func (m *members) read(ctx context.Context, rid string, generation uint64, address string) (*location.NodeDescriptor, error) {
	if rid == "" {
		return nil, fmt.Errorf("%w: no node RID given", ErrNotMember)
	}
	v, err := m.store.ReadNode(ctx, location.NodeKey{Mesh: m.mesh, NodeRid: rid})
	switch {
	case errors.Is(err, location.ErrPermissionDenied):
		return nil, fmt.Errorf("%w: read node %s: %w", roamerr.ErrPermissionDenied, rid, err)
	case errors.Is(err, location.ErrNotFound):
		return nil, fmt.Errorf("%w: node %s has no descriptor in mesh %q", errOtherMesh, rid, m.mesh)
	case errors.Is(err, location.ErrInvalid):
		return nil, fmt.Errorf("%w: node RID %q", ErrNotMember, rid)
	case err != nil:
		return nil, fmt.Errorf("%w: read node %s: %w", roamerr.ErrUnavailable, rid, err)
	}
	d := v.Node
	if d.GetNodeGeneration() != generation || d.GetAddress() != address {
		return nil, fmt.Errorf("%w: node %s is not that lifecycle at %s", ErrNotMember, rid, address)
	}
	m.mu.Lock()
	m.seen[address] = memberSeen{desc: d, at: time.Now()}
	m.mu.Unlock()
	return d, nil
}

// PeerAt returns the descriptor of the live node of this node's mesh at
// address (a remote address as a control message's sender declares it),
// or an error matching ErrNotMember (roamerr.ErrPermissionDenied) — or
// roamerr.ErrUnavailable when the store cannot tell now (an unknown
// address lists the mesh at most every 250 ms).
func (n *Node) PeerAt(ctx context.Context, address string) (*location.NodeDescriptor, error) {
	if address == n.desc.GetAddress() {
		return n.desc, nil
	}
	return n.members.at(ctx, address)
}

// VerifyPeer checks that the node lifecycle (rid, generation) a control
// message names as its sender is a live node of this node's mesh, at the
// address the message came from. Errors as PeerAt.
func (n *Node) VerifyPeer(ctx context.Context, rid string, generation uint64, address string) error {
	if rid == n.desc.GetNodeRid() {
		if generation == n.desc.GetNodeGeneration() && address == n.desc.GetAddress() {
			return nil
		}
		return fmt.Errorf("%w: a peer at %s names this node's RID", ErrNotMember, address)
	}
	return n.members.verify(ctx, rid, generation, address)
}

// peerFrameBytes is the largest frame a node sends to address: a live
// node of its mesh takes MaxFrameBytes; any other peer is assumed to keep
// gRPC's default receive limit. When the store cannot tell, the peer is
// taken for a node (roam's own traffic must not shrink in a store outage).
func (n *Node) peerFrameBytes(address string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := n.PeerAt(ctx, address); errors.Is(err, ErrNotMember) {
		return defaultFrameBytes
	}
	return MaxFrameBytes
}
