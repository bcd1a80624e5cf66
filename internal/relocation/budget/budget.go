// Package budget is the in-flight payload budget of a node's moves out
// (docs/PROTOCOL.md §5.3): which move may seal, and which of its chunks
// may go, while the chunk bytes handed to a peer and not yet credited
// stay within the budget per peer, the budget of the node, and the chunk
// window.
//
// It is pure: the driver and the hand-off simulation call it with what
// happened (a move asks for admission, submits chunks, is credited, loses
// its connection, no longer needs its budget, ends) and send what each
// call lets go. Not safe for concurrent use.
package budget

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// Budget is one node's in-flight payload budget.
type Budget struct {
	// perPeer and perNode bound the bytes in flight to one peer and to all
	// (0: no bound); window paces the chunks of admitted moves below
	// perPeer without changing their admission (0: no pacing).
	perPeer, perNode, window int64
	// peers in the order first seen. When the node's budget is bounded, a
	// release lets every peer's queue and waiting moves go, so no peer
	// waits for a release of its own that may never come (nothing of it
	// in flight); the chunks take the node's budget in submission order
	// (pumpNode).
	peers  []*peer
	byAddr map[string]*peer
	// inflight is the bytes in flight to all peers: the sum of the peers'.
	inflight int64
	runs     map[uint64]*run
	// seq numbers the chunks submitted, in order.
	seq uint64
}

type peer struct {
	addr string
	// inflight is the bytes handed to the peer and not yet credited,
	// returned or lost: the sum over its runs of handed − credited.
	inflight int64
	// queue holds the chunks of admitted moves not handed over yet, in
	// submission order.
	queue []queued
	// waiting holds the moves waiting for admission, oldest first; each
	// is a run with waiting set.
	waiting []uint64
	// sealing counts the moves admitted to p that have not submitted
	// their chunks yet (their seals and captures are under way). Each
	// holds a reserve of the peer's budget (Budget.reserve) until its
	// chunks are known: admitted all at once, a burst would seal every
	// object and then queue their chunks, each waiting inside its pause
	// instead of before its seal.
	sealing int
}

type run struct {
	id   uint64
	peer *peer
	// handed is the chunk bytes handed to the peer (since the last lost
	// connection: what went before was given back); credited ≤ handed is
	// what of them the target credited or was given back. A credit never
	// passes handed: the target counts chunks that came before a lost
	// connection too, and crediting them again would return other
	// moves' bytes.
	handed, credited uint64
	waiting          bool
	// sealing: admitted, its chunks not submitted yet (peer.sealing).
	sealing bool
}

// admit admits the waiting or new move r: it seals now, holding a reserve
// of its peer's budget until it submits or ends.
func (r *run) admit() {
	r.waiting = false
	r.sealing = true
	r.peer.sealing++
}

// sealed: r submitted its chunks, or ended; its reserve returns.
func (r *run) sealed() bool {
	if !r.sealing {
		return false
	}
	r.sealing = false
	r.peer.sealing--
	return true
}

// reserve is what of a peer's budget a sealing move holds: one chunk
// window (a payload's first window goes at once), or the whole budget
// without a window. So a burst of moves to one peer seals about
// budget ÷ window at a time (16 by default), not one by one: a sealing
// move waits for its object's current turn, and one slow turn must not
// hold every later move to the peer.
func (b *Budget) reserve() int64 {
	if b.window > 0 && (b.perPeer == 0 || b.window < b.perPeer) {
		return b.window
	}
	return b.perPeer
}

// Queued is a chunk of a move (its RelocationId) that may go now.
type Queued struct {
	Run   uint64
	Chunk envelope.Chunk
}

// queued is a chunk in a peer's queue, numbered in submission order
// across peers.
type queued struct {
	Queued
	seq uint64
}

func (q queued) size() int64 { return int64(len(q.Chunk.Data)) }

// Out is what a call lets go: chunks to send now, in order, and the moves
// admitted now, oldest first.
type Out struct {
	Chunks   []Queued
	Admitted []uint64
}

// New is a budget of perPeer bytes per peer and perNode for the node
// (0: unbounded), pacing chunks by window (0: unpaced).
func New(perPeer, perNode, window int64) *Budget {
	return &Budget{perPeer: perPeer, perNode: perNode, window: window, byAddr: map[string]*peer{}, runs: map[uint64]*run{}}
}

func (b *Budget) peer(addr string) *peer {
	p := b.byAddr[addr]
	if p == nil {
		p = &peer{addr: addr}
		b.byAddr[addr] = p
		b.peers = append(b.peers, p)
	}
	return p
}

func (b *Budget) run(addr string, id uint64) *run {
	r := b.runs[id]
	if r == nil {
		r = &run{id: id, peer: b.peer(addr)}
		b.runs[id] = r
	}
	return r
}

func (b *Budget) full(p *peer) bool {
	return (b.perPeer > 0 && p.inflight >= b.perPeer) || (b.perNode > 0 && b.inflight >= b.perNode)
}

// Admit asks for the move id to peer to seal: true when it may now;
// otherwise it waits, before its seal (the object keeps serving), and a
// later Out names it. A move waits while the peer's budget or the node's
// is full (sealing moves' reserves counted), chunks to the peer still
// queue, or a chunk to any peer waits for the node's budget.
func (b *Budget) Admit(peer string, id uint64) bool {
	r := b.run(peer, id)
	if r.waiting || r.sealing {
		return r.sealing
	}
	if b.admits(r.peer, b.nodeHeld()) {
		r.admit()
		return true
	}
	r.waiting = true
	r.peer.waiting = append(r.peer.waiting, id)
	return false
}

// Submit queues chunks of the move id to peer and says which may go now,
// and which move to the peer is admitted next, now that this one's
// chunks are known (a resend after a lost connection submits again).
func (b *Budget) Submit(peer string, id uint64, chunks []envelope.Chunk) Out {
	r := b.run(peer, id)
	for _, c := range chunks {
		b.seq++
		r.peer.queue = append(r.peer.queue, queued{Queued: Queued{Run: id, Chunk: c}, seq: b.seq})
	}
	var out Out
	if b.perNode > 0 {
		out.Chunks = b.pumpNode(nil)
	} else {
		out.Chunks = b.pump(r.peer, nil)
	}
	if r.sealed() {
		b.admitWaiting(r.peer, &out)
	}
	return out
}

// peerFits: n more bytes to p are within p's budget and the window;
// nodeFits: within the node's. Each bound lets a chunk go when nothing it
// counts is in flight, so a payload larger than the budget or the window
// still starts and completes; and only the node's bound counts other
// peers' bytes (a chunk to an idle peer does not wait for another peer's
// credit, which would not let it go).
func (b *Budget) peerFits(p *peer, n int64) bool {
	return p.inflight == 0 || (b.perPeer == 0 || p.inflight+n <= b.perPeer) && (b.window == 0 || p.inflight+n <= b.window)
}

func (b *Budget) nodeFits(n int64) bool {
	return b.perNode == 0 || b.inflight == 0 || b.inflight+n <= b.perNode
}

// pump hands over p's queued chunks that fit its bounds (no node budget).
func (b *Budget) pump(p *peer, out []Queued) []Queued {
	for len(p.queue) > 0 && b.peerFits(p, p.queue[0].size()) {
		out = b.hand(p, out)
	}
	return out
}

// pumpNode hands over, under a node budget, the queued chunks that fit in
// submission order across peers: of the peers' first chunks that their
// own bounds let go, the oldest goes if the node's budget lets it, and
// otherwise nothing goes past it. A chunk only the node's budget holds
// back then waits for the bytes in flight to drain, not for a lull in
// other peers' traffic (which a stream of moves to one peer may never
// leave; its sealed move would wait until its restore deadline).
func (b *Budget) pumpNode(out []Queued) []Queued {
	for {
		p := b.nextNode()
		if p == nil || !b.nodeFits(p.queue[0].size()) {
			return out
		}
		out = b.hand(p, out)
	}
}

// nextNode is the peer whose first queued chunk is the oldest that its
// peer's bounds let go (nil: none).
func (b *Budget) nextNode() *peer {
	var next *peer
	for _, p := range b.peers {
		if len(p.queue) > 0 && b.peerFits(p, p.queue[0].size()) && (next == nil || p.queue[0].seq < next.queue[0].seq) {
			next = p
		}
	}
	return next
}

// nodeHeld reports whether a chunk waits for the node's budget alone:
// the node's budget is promised to it, so no move is admitted meanwhile.
func (b *Budget) nodeHeld() bool {
	if b.perNode == 0 {
		return false
	}
	p := b.nextNode()
	return p != nil && !b.nodeFits(p.queue[0].size())
}

// admits: a move to p may seal now (held: nodeHeld).
func (b *Budget) admits(p *peer, held bool) bool {
	return !b.full(p) && len(p.queue) == 0 && !held &&
		(p.sealing == 0 || b.perPeer == 0 || p.inflight+int64(p.sealing)*b.reserve() < b.perPeer)
}

// admitWaiting admits p's waiting moves, oldest first, while they may
// seal; admitEach does so for each peer of order.
func (b *Budget) admitWaiting(p *peer, out *Out) { b.admitEach([]*peer{p}, out) }

func (b *Budget) admitEach(order []*peer, out *Out) {
	held := b.nodeHeld()
	for _, q := range order {
		for len(q.waiting) > 0 && b.admits(q, held) {
			id := q.waiting[0]
			q.waiting = q.waiting[1:]
			b.runs[id].admit()
			out.Admitted = append(out.Admitted, id)
		}
	}
}

// hand hands p's first queued chunk over.
func (b *Budget) hand(p *peer, out []Queued) []Queued {
	q := p.queue[0]
	n := q.size()
	p.inflight += n
	b.inflight += n
	b.runs[q.Run].handed += uint64(n)
	clear(p.queue[:1])
	p.queue = p.queue[1:]
	return append(out, q.Queued)
}

// Credit takes the target's count of the move's bytes it has received
// (it counts resent chunks too): what it credits anew returns to the
// budget.
func (b *Budget) Credit(id uint64, received uint64) Out {
	r := b.runs[id]
	if r == nil || received <= r.credited {
		return Out{}
	}
	n := min(received, r.handed) - r.credited
	r.credited += n
	return b.release(r.peer, int64(n))
}

// LostPeer gives back what every move to peer sent and the target did
// not credit: the connection was lost, so it may never be credited, and
// each move's resend counts again from what its target credited. Their
// queued chunks are dropped (each resends its own). All at once, before
// any of them resends: one move's release would otherwise send another's
// queued chunks on the new connection, only for that one's loss to count
// them lost.
func (b *Budget) LostPeer(peer string) Out {
	p := b.byAddr[peer]
	if p == nil {
		return Out{}
	}
	clear(p.queue)
	p.queue = p.queue[:0]
	for _, r := range b.runs {
		if r.peer == p {
			r.handed = r.credited
		}
	}
	return b.release(p, p.inflight)
}

// Return gives back what the move still holds: its target holds the whole
// payload (relay-ready), so nothing it sent will be credited, and a resent
// copy still queued does not go.
func (b *Budget) Return(id uint64) Out {
	r := b.runs[id]
	if r == nil {
		return Out{}
	}
	n := b.drop(r)
	r.credited = r.handed
	return b.release(r.peer, n)
}

// End forgets the move: what it holds returns, and it no longer waits for
// admission.
func (b *Budget) End(id uint64) Out {
	r := b.runs[id]
	if r == nil {
		return Out{}
	}
	p := r.peer
	if r.waiting {
		for i, w := range p.waiting {
			if w == id {
				p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
				break
			}
		}
	}
	r.sealed() // it ended before its chunks: its reserve returns
	out := b.Return(id)
	delete(b.runs, id)
	return out
}

// drop removes r's queued chunks and returns the bytes it holds in
// flight (handed over, not credited).
func (b *Budget) drop(r *run) int64 {
	q := r.peer.queue[:0]
	for _, c := range r.peer.queue {
		if c.Run != r.id {
			q = append(q, c)
		}
	}
	clear(r.peer.queue[len(q):])
	r.peer.queue = q
	return int64(r.handed - r.credited)
}

// release returns n bytes of p's budget: the chunks that fit go (every
// peer's, in submission order, when the node's budget is shared), and the
// moves that may seal are admitted, p's first, then (the node's budget
// being shared) every other peer's in turn.
func (b *Budget) release(p *peer, n int64) Out {
	n = min(n, p.inflight)
	p.inflight -= n
	b.inflight -= n
	var out Out
	order := []*peer{p}
	if b.perNode > 0 {
		order = b.peers
		for i, q := range b.peers {
			if q == p {
				order = append(append([]*peer{}, b.peers[i:]...), b.peers[:i]...)
				break
			}
		}
	}
	if b.perNode > 0 {
		out.Chunks = b.pumpNode(out.Chunks)
	} else {
		out.Chunks = b.pump(p, out.Chunks)
	}
	b.admitEach(order, &out)
	return out
}

// InFlight is the bytes handed to peer and not yet credited, returned or
// lost.
func (b *Budget) InFlight(peer string) int64 {
	if p := b.byAddr[peer]; p != nil {
		return p.inflight
	}
	return 0
}

// Stalled describes a chunk that queues, or a move that waits for
// admission, though the budget would let it go now ("" when none): what a
// release should have let go, and nothing else will (a check for tests
// and the simulation; every call leaves none).
func (b *Budget) Stalled() string {
	held := b.nodeHeld()
	for _, p := range b.peers {
		if len(p.queue) > 0 && b.peerFits(p, p.queue[0].size()) && (b.perNode == 0 || p == b.nextNode() && !held) {
			return fmt.Sprintf("a chunk of move %d queues for %s, which has room (%d of %d in flight, node %d of %d)",
				p.queue[0].Run, p.addr, p.inflight, b.perPeer, b.inflight, b.perNode)
		}
		if len(p.waiting) > 0 && b.admits(p, held) {
			return fmt.Sprintf("move %d waits for admission to %s, which has room (%d of %d in flight, node %d of %d)",
				p.waiting[0], p.addr, p.inflight, b.perPeer, b.inflight, b.perNode)
		}
	}
	return ""
}

// String lists what the budget holds: each peer's bytes in flight, queued
// chunks and waiting moves, and the moves it knows, with their bytes handed
// over and credited.
func (b *Budget) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "in flight %d", b.inflight)
	for _, p := range b.peers {
		fmt.Fprintf(&sb, "; %s: in flight %d, queued %d, sealing %d, waiting %v", p.addr, p.inflight, len(p.queue), p.sealing, p.waiting)
	}
	ids := slices.Sorted(maps.Keys(b.runs))
	for _, id := range ids {
		r := b.runs[id]
		fmt.Fprintf(&sb, "; move %d to %s: handed %d, credited %d", id, r.peer.addr, r.handed, r.credited)
	}
	return sb.String()
}

// Idle reports whether nothing is in flight, queued or waiting, and no
// move is known: what a node's budget is once its moves out have ended.
func (b *Budget) Idle() bool {
	if b.inflight != 0 || len(b.runs) != 0 {
		return false
	}
	for _, p := range b.peers {
		if p.inflight != 0 || len(p.queue) != 0 || len(p.waiting) != 0 || p.sealing != 0 {
			return false
		}
	}
	return true
}
