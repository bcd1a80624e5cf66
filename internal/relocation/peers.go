package relocation

import "sync"

// peerLinks remembers the peer addresses whose Proto.Actor connection
// ended (EndpointTerminatedEvent) and has not been made again
// (EndpointConnectedEvent). Proto.Actor does not fail what is sent to
// such an address: a new endpoint dials it for seconds and then drops
// what it held. Message Follow and the calls by Spot ID check the
// address here before they send, and look the owner up in the store
// instead when its connection ended.
type peerLinks struct {
	mu    sync.RWMutex
	ended map[string]struct{}
}

// maxEndedPeers bounds the addresses remembered (every restart of a peer
// leaves one behind); forgetting them costs only the check.
const maxEndedPeers = 4096

func (p *peerLinks) lost(address string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended == nil || len(p.ended) >= maxEndedPeers {
		p.ended = map[string]struct{}{}
	}
	p.ended[address] = struct{}{}
}

func (p *peerLinks) connected(address string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ended, address)
}

func (p *peerLinks) isEnded(address string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.ended[address]
	return ok
}

// ConnectionEnded reports whether this node's connection to the peer at
// address ended and has not been made again: whatever is sent there now
// is likely lost after seconds of redialling (peerLinks).
func (d *Driver) ConnectionEnded(address string) bool { return d.peers.isEnded(address) }
