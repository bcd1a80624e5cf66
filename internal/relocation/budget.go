package relocation

import "github.com/roamactors/roam/internal/relocation/envelope"

// budget limits the relocation chunk bytes in flight per peer and,
// optionally, per node (docs/PROTOCOL.md §5.3). A unit waits for admission before
// its seal while the peer's budget is full; chunks of admitted units go out
// in submission order as credit returns. A chunk is always sent when
// nothing is in flight, so no payload size is kept from starting or
// finishing. It is driven from the driver actor only: no locking.
type budget struct {
	perPeer, perNode int64 // 0 = no limit
	// window: chunks are sent to a peer only while its bytes in flight
	// stay within it (0 = no limit); below perPeer, it paces admitted
	// moves' chunks without changing their admission.
	window       int64
	inflight     map[string]int64
	nodeInflight int64
	queue        map[string][]queuedChunk
	waiting      map[string][]func()
}

type queuedChunk struct {
	run   uint64 // RelocationId of the source run
	chunk envelope.Chunk
}

func newBudget(perPeer, perNode, window int64) *budget {
	return &budget{
		perPeer: perPeer, perNode: perNode, window: window,
		inflight: map[string]int64{},
		queue:    map[string][]queuedChunk{},
		waiting:  map[string][]func(){},
	}
}

func (b *budget) full(peer string) bool {
	return (b.perPeer > 0 && b.inflight[peer] >= b.perPeer) || (b.perNode > 0 && b.nodeInflight >= b.perNode)
}

// admit calls admitted now if peer has room, or later when it does.
func (b *budget) admit(peer string, admitted func()) {
	if !b.full(peer) && len(b.queue[peer]) == 0 {
		admitted()
		return
	}
	b.waiting[peer] = append(b.waiting[peer], admitted)
}

// submit queues chunks of a run for peer and returns what may go now.
func (b *budget) submit(peer string, run uint64, chunks []envelope.Chunk) []queuedChunk {
	for _, c := range chunks {
		b.queue[peer] = append(b.queue[peer], queuedChunk{run: run, chunk: c})
	}
	return b.pump(peer)
}

func (b *budget) fits(peer string, n int64) bool {
	if b.inflight[peer] == 0 && b.nodeInflight == 0 {
		return true
	}
	return (b.perPeer == 0 || b.inflight[peer]+n <= b.perPeer) && (b.perNode == 0 || b.nodeInflight+n <= b.perNode) &&
		(b.window == 0 || b.inflight[peer]+n <= b.window)
}

func (b *budget) pump(peer string) []queuedChunk {
	var out []queuedChunk
	q := b.queue[peer]
	for len(q) > 0 && b.fits(peer, int64(len(q[0].chunk.Data))) {
		n := int64(len(q[0].chunk.Data))
		b.inflight[peer] += n
		b.nodeInflight += n
		out = append(out, q[0])
		q = q[1:]
	}
	b.queue[peer] = q
	return out
}

// release returns n bytes of peer's budget and reports the chunks that may
// go now and the admissions that may proceed.
func (b *budget) release(peer string, n int64) ([]queuedChunk, []func()) {
	if n > b.inflight[peer] {
		n = b.inflight[peer]
	}
	b.inflight[peer] -= n
	b.nodeInflight -= n
	chunks := b.pump(peer)
	var admitted []func()
	for len(b.waiting[peer]) > 0 && !b.full(peer) && len(b.queue[peer]) == 0 {
		admitted = append(admitted, b.waiting[peer][0])
		b.waiting[peer] = b.waiting[peer][1:]
	}
	return chunks, admitted
}

// drop removes a run's unsent chunks (its move ended, or its target holds
// the whole payload) and returns their bytes, which were never in flight.
func (b *budget) drop(peer string, run uint64) (unsent int64) {
	q := b.queue[peer][:0]
	for _, c := range b.queue[peer] {
		if c.run != run {
			q = append(q, c)
		} else {
			unsent += int64(len(c.chunk.Data))
		}
	}
	b.queue[peer] = q
	return unsent
}
