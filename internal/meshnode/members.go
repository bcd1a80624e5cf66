package meshnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// ErrNotMember: a peer that claims to be a node of the mesh is not one
// the Location Store knows at that address and generation — an outsider,
// or a node whose lease has ended. It matches roamerr.ErrPermissionDenied.
var ErrNotMember = fmt.Errorf("%w: not a live member of the mesh", roamerr.ErrPermissionDenied)

// members answers "is this peer a live node of the cluster?" (of any mesh
// of the Location Store) from the store's node descriptors: a descriptor
// exists only while its owner lease lives, and names the node's RID,
// generation and remote address. Control messages are accepted only from
// such a peer; without mutual TLS the address is what the peer declares,
// so the check is that the answer to a query goes to a member, never to
// whoever asked (docs/SECURITY.md).
//
// What a peer sends never picks what the store is asked: an unknown
// address costs at most one list of the nodes per listEvery, shared by
// everyone waiting, and a known one a read of the descriptor it had. So a
// stream of messages from outsiders cannot turn into a stream of store
// calls.
type members struct {
	store location.Store

	mu sync.Mutex
	// seen: address → the descriptor last read for it, and when. A hit
	// younger than memberFresh is trusted without a store read.
	seen map[string]memberSeen
	// all: every node of the last list that answered (nil before one).
	all []*location.NodeDescriptor
	// listed is when the nodes were last listed; listing is closed when
	// the list in progress (if any) ends.
	listed  time.Time
	listing chan struct{}
	listErr error // the last list's failure, nil if it answered
}

type memberSeen struct {
	desc *location.NodeDescriptor
	at   time.Time
}

const (
	memberFresh = time.Second
	listEvery   = 250 * time.Millisecond
)

func newMembers(store location.Store) *members {
	return &members{store: store, seen: map[string]memberSeen{}}
}

// at returns the live member at address, ErrNotMember when a list of the
// nodes begun after the call does not have it, or roamerr.ErrUnavailable
// when the store cannot tell (or ctx ends first; a store that refuses
// roam's token: roamerr.ErrPermissionDenied).
func (m *members) at(ctx context.Context, address string) (*location.NodeDescriptor, error) {
	// The membership cache paces store reads: real time, whatever the
	// node's clock, so a node joining in a logical-time test is seen.
	arrived := machine.Real.Now()
	for {
		now := machine.Real.Now()
		m.mu.Lock()
		s, known := m.seen[address]
		switch {
		case known && now.Sub(s.at) < memberFresh:
			m.mu.Unlock()
			return s.desc, nil
		case known:
			// Re-read the descriptor we know: one read, never rate-limited
			// (a member is not refused for a busy outsider).
			m.mu.Unlock()
			d, err := m.read(ctx, s.desc.GetMesh(), s.desc.GetNodeRid(), s.desc.GetNodeGeneration(), address)
			if err == nil || !errors.Is(err, ErrNotMember) {
				return d, err
			}
			m.mu.Lock()
			if cur, ok := m.seen[address]; ok && cur.desc == s.desc {
				delete(m.seen, address)
			}
			m.mu.Unlock()
			continue
		case !m.listed.Before(arrived) && m.listing == nil:
			// A list that began after this call ended without it.
			err := m.listErr
			m.mu.Unlock()
			if err != nil {
				return nil, roamerr.Keep(roamerr.ErrUnavailable, "list the nodes", err)
			}
			return nil, fmt.Errorf("%w: no node is at %s", ErrNotMember, address)
		case m.listing != nil:
			wait := m.listing
			m.mu.Unlock()
			if err := sleepOn(ctx, wait, 0); err != nil {
				return nil, err
			}
			continue
		case now.Sub(m.listed) < listEvery:
			wait := listEvery - now.Sub(m.listed)
			m.mu.Unlock()
			if err := sleepOn(ctx, nil, wait); err != nil {
				return nil, err
			}
			continue
		}
		if err := m.listLocked(ctx, now); err != nil {
			return nil, err
		}
	}
}

// listLocked lists the nodes of every mesh (a call may come from another
// mesh's node) for everyone waiting; called with m.mu held, it returns
// with it released.
func (m *members) listLocked(ctx context.Context, now time.Time) error {
	done := make(chan struct{})
	m.listing, m.listed = done, now
	m.mu.Unlock()
	nodes, err := m.store.ListNodes(ctx, "")
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listing, m.listErr = nil, err
	close(done)
	if err != nil {
		return roamerr.Keep(roamerr.ErrUnavailable, "list the nodes", err)
	}
	// The list is the whole truth: addresses gone from it are dropped.
	m.all = make([]*location.NodeDescriptor, 0, len(nodes))
	m.seen = make(map[string]memberSeen, len(nodes))
	for _, n := range nodes {
		m.all = append(m.all, n.Node)
		m.seen[n.Node.GetAddress()] = memberSeen{desc: n.Node, at: now}
	}
	return nil
}

// live returns the live nodes of every mesh as listed at most maxAge ago,
// listing them (once for every caller waiting) otherwise.
func (m *members) live(ctx context.Context, maxAge time.Duration) ([]*location.NodeDescriptor, error) {
	for {
		now := machine.Real.Now()
		m.mu.Lock()
		switch {
		case m.listing != nil:
			wait := m.listing
			m.mu.Unlock()
			if err := sleepOn(ctx, wait, 0); err != nil {
				return nil, err
			}
			continue
		case m.all != nil && m.listErr == nil && now.Sub(m.listed) < maxAge:
			all := m.all
			m.mu.Unlock()
			return all, nil
		}
		if err := m.listLocked(ctx, now); err != nil {
			return nil, err
		}
	}
}

// sleepOn waits for ch to close (nil: never) or d to pass (0: never),
// or ctx.
func sleepOn(ctx context.Context, ch <-chan struct{}, d time.Duration) error {
	var after <-chan time.Time
	if d > 0 {
		fire, t := machine.NewTimer(machine.Real, d)
		defer t.Stop()
		after = fire
	}
	select {
	case <-ch:
	case <-after:
	case <-ctx.Done():
		return fmt.Errorf("%w: checking a peer: %w", roamerr.ErrUnavailable, ctx.Err())
	}
	return nil
}

// LiveNodes returns the live nodes of every mesh as the store listed them
// at most maxAge ago: one list shared with the membership checks and with
// every other caller waiting, never more often than asked.
func (n *Node) LiveNodes(ctx context.Context, maxAge time.Duration) ([]*location.NodeDescriptor, error) {
	return n.members.live(ctx, maxAge)
}

// verify checks that the node lifecycle (rid, generation) is a live
// member at address.
func (m *members) verify(ctx context.Context, rid string, generation uint64, address string) error {
	d, err := m.at(ctx, address)
	if err != nil {
		return err
	}
	if d.GetNodeRid() != rid || d.GetNodeGeneration() != generation {
		// What was seen at the address may be an earlier lifecycle (a
		// restart, or a rejoin on the same system, reuses the address):
		// the store decides.
		if _, err := m.read(ctx, d.GetMesh(), rid, generation, address); err != nil {
			return fmt.Errorf("the node at %s is another lifecycle than the one named: %w", address, err)
		}
	}
	return nil
}

// read re-reads the descriptor of a node known at address.
func (m *members) read(ctx context.Context, mesh, rid string, generation uint64, address string) (*location.NodeDescriptor, error) {
	v, err := m.store.ReadNode(ctx, location.NodeKey{Mesh: mesh, NodeRid: rid})
	switch {
	case errors.Is(err, location.ErrPermissionDenied):
		return nil, fmt.Errorf("%w: read node %s: %w", roamerr.ErrPermissionDenied, rid, err)
	case errors.Is(err, location.ErrNotFound), errors.Is(err, location.ErrInvalid):
		return nil, fmt.Errorf("%w: node %s is gone", ErrNotMember, rid)
	case err != nil:
		return nil, roamerr.Keep(roamerr.ErrUnavailable, "read node "+rid, err)
	}
	d := v.Node
	if d.GetNodeGeneration() != generation || d.GetAddress() != address {
		return nil, fmt.Errorf("%w: node %s is not that lifecycle at %s", ErrNotMember, rid, address)
	}
	m.mu.Lock()
	m.seen[address] = memberSeen{desc: d, at: machine.Real.Now()}
	m.mu.Unlock()
	return d, nil
}

// PeerAt returns the descriptor of the live node of the cluster (of any
// mesh) at address (a remote address as a control message's sender
// declares it), or an error matching ErrNotMember
// (roamerr.ErrPermissionDenied) — or roamerr.ErrUnavailable when the
// store cannot tell. An unknown address waits for the next list of the
// nodes (at most every 250 ms, shared).
func (n *Node) PeerAt(ctx context.Context, address string) (*location.NodeDescriptor, error) {
	if address == n.desc.GetAddress() {
		return n.desc, nil
	}
	return n.members.at(ctx, address)
}

// VerifyPeer checks that the node lifecycle (rid, generation) a control
// message names as its sender is a live node of the cluster, at the
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
	// Real time: the transport's path waits for it, and the transport runs
	// on real time whatever the node's clock does.
	ctx, cancel := machine.WithTimeout(context.Background(), machine.Real, time.Second)
	defer cancel()
	if _, err := n.PeerAt(ctx, address); errors.Is(err, ErrNotMember) {
		return defaultFrameBytes
	}
	return MaxFrameBytes
}

// lastKnown is the descriptor last read for address, however old; nil if
// none was.
func (m *members) lastKnown(address string) *location.NodeDescriptor {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[address].desc
}
