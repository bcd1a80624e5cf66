package relocation

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/roamactors/roam/internal/machine"
)

// peerLinks remembers the peer addresses whose Proto.Actor connection
// ended (EndpointTerminatedEvent) and has not been made again
// (EndpointConnectedEvent). Proto.Actor does not fail what is sent to
// such an address: a new endpoint dials it for seconds and then drops
// what it held. Message Follow and the calls by Spot ID check the
// address here before they send, and look the owner up in the store
// instead when its connection ended. The check is on the call path, so
// it takes no lock (a sync.Map read).
type peerLinks struct {
	clock machine.Clock
	ended sync.Map // address → struct{}
	n     atomic.Int64
	// leavingAt: peers that said they are about to stop (a drained node's
	// Leaving), address → leavingMark; a connection made again does not
	// clear it (answering the peer makes one), only leavingFor does. It
	// names the leaving node's lifecycle: a node started again under the
	// same address (a rolling restart on fixed ports) is not leaving.
	leavingAt sync.Map
	// watchers: per address, the channels to close when its connection
	// ends (whenEnded).
	watchMu  sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
}

// whenEnded returns a channel closed once the connection to address ends
// (at once if it has), and the call that stops watching.
func (p *peerLinks) whenEnded(address string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	p.watchMu.Lock()
	if p.isEnded(address) {
		p.watchMu.Unlock()
		close(ch)
		return ch, func() {}
	}
	if p.watchers == nil {
		p.watchers = map[string]map[chan struct{}]struct{}{}
	}
	if p.watchers[address] == nil {
		p.watchers[address] = map[chan struct{}]struct{}{}
	}
	p.watchers[address][ch] = struct{}{}
	p.watchMu.Unlock()
	return ch, func() {
		p.watchMu.Lock()
		defer p.watchMu.Unlock()
		if w := p.watchers[address]; w != nil {
			delete(w, ch)
			if len(w) == 0 {
				delete(p.watchers, address)
			}
		}
	}
}

// leavingMark is a peer's Leaving: which lifecycle (node RID) said it, when.
type leavingMark struct {
	rid string
	at  time.Time
}

// leavingFor is how long a peer that said it is leaving is not sent to by
// a route: far longer than its stop takes; its descriptor is gone by then,
// which routes see anyway.
const leavingFor = time.Minute

func (p *peerLinks) leaving(address, rid string) {
	p.leavingAt.Store(address, leavingMark{rid: rid, at: p.clock.Now()})
}

// isLeaving: the lifecycle rid at address said it is leaving. A caller
// that does not know which lifecycle it sends to passes "": any.
func (p *peerLinks) isLeaving(address, rid string) bool {
	v, ok := p.leavingAt.Load(address)
	if !ok {
		return false
	}
	m := v.(leavingMark)
	if machine.Since(p.clock, m.at) > leavingFor {
		p.leavingAt.CompareAndDelete(address, v)
		return false
	}
	return rid == "" || m.rid == rid
}

// maxEndedPeers bounds the addresses remembered (every restart of a peer
// leaves one behind); forgetting them costs only the check.
const maxEndedPeers = 4096

func (p *peerLinks) lost(address string) {
	if p.n.Load() >= maxEndedPeers {
		p.ended.Range(func(k, _ any) bool {
			if _, ok := p.ended.LoadAndDelete(k); ok {
				p.n.Add(-1)
			}
			return true
		})
	}
	if _, had := p.ended.LoadOrStore(address, struct{}{}); !had {
		p.n.Add(1)
	}
	p.watchMu.Lock()
	for ch := range p.watchers[address] {
		close(ch)
	}
	delete(p.watchers, address)
	p.watchMu.Unlock()
}

func (p *peerLinks) connected(address string) {
	if _, ok := p.ended.LoadAndDelete(address); ok {
		p.n.Add(-1)
	}
}

func (p *peerLinks) isEnded(address string) bool {
	_, ok := p.ended.Load(address)
	return ok
}

// ConnectionEnded reports whether this node's connection to the peer at
// address ended and has not been made again: whatever is sent there now
// is likely lost after seconds of redialling (peerLinks).
func (d *Driver) ConnectionEnded(address string) bool { return d.peers.isEnded(address) }

// PeerLeaving reports whether the node lifecycle rid at address said it is
// about to stop (a drained node's Leaving): a route cached to it is read
// from the store again, whatever its descriptor says. rid "" asks about
// whichever lifecycle is at address.
func (d *Driver) PeerLeaving(address, rid string) bool { return d.peers.isLeaving(address, rid) }

// Departed is ConnectionEnded or PeerLeaving: nothing should be sent to
// the lifecycle rid at address now without a look at the store first.
func (d *Driver) Departed(address, rid string) bool {
	return d.peers.isEnded(address) || d.peers.isLeaving(address, rid)
}
