package budget

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

func chunks(n, size int) []envelope.Chunk {
	out := make([]envelope.Chunk, n)
	for i := range out {
		out[i] = envelope.Chunk{Index: uint32(i), Offset: uint64(i * size), Data: make([]byte, size)}
	}
	return out
}

// A new move is admitted at once while the peer's budget has room and
// waits, before its seal, while it is full; chunks go out as credit
// returns, and a payload larger than the budget still flows.
// Reference: docs/PROTOCOL.md §5.3.
func TestAdmissionAndPacing(t *testing.T) {
	b := New(100, 0, 0)
	require.True(t, b.Admit("p", 1))
	sent := b.Submit("p", 1, chunks(5, 60)).Chunks // 300 bytes against a 100-byte budget
	require.Len(t, sent, 1, "one chunk fits; the first always goes")
	require.False(t, b.Admit("p", 2), "a second move waits while the budget is full")

	total, credited := len(sent), uint64(0)
	var admitted []uint64
	for total < 5 {
		require.Empty(t, admitted, "admitted while chunks still queue")
		credited += 60
		out := b.Credit(1, credited)
		require.NotEmpty(t, out.Chunks)
		total += len(out.Chunks)
		admitted = append(admitted, out.Admitted...)
	}
	require.Equal(t, []uint64{2}, admitted, "the waiting move is admitted once the queue has drained and there is room")
	require.Empty(t, b.Return(1).Chunks)
	b.End(1)
	b.End(2)
	require.True(t, b.Idle())
}

// The node-wide budget limits every peer together; a release on one peer
// lets another peer's queued chunks and waiting moves go (nothing of that
// peer is in flight to release them); a chunk that waits for the node's
// budget alone holds it, so no move is admitted past it; 0 turns a budget
// off.
// Reference: PROTOCOL.md §5.3 (RelocationNodeInFlightPayloadBudget).
func TestNodeBudgetSpansPeers(t *testing.T) {
	b := New(0, 100, 0)
	require.True(t, b.Admit("p1", 1))
	require.Len(t, b.Submit("p1", 1, chunks(1, 80)).Chunks, 1)
	require.True(t, b.Admit("p2", 2), "p2's queue is empty and the node budget not full")
	require.Empty(t, b.Submit("p2", 2, chunks(1, 80)).Chunks, "the node budget is spent")
	require.False(t, b.Admit("p3", 3), "p2's chunk waits for the node budget")

	out := b.Credit(1, 80)
	require.Len(t, out.Chunks, 1, "p1's release lets p2's chunk go")
	require.EqualValues(t, 2, out.Chunks[0].Run)
	require.Equal(t, []uint64{3}, out.Admitted, "then p3's move, with 20 bytes of room")
	require.Len(t, b.Submit("p3", 3, chunks(1, 20)).Chunks, 1, "20 more bytes fit")
	require.False(t, b.Admit("p3", 4), "the node budget is full")
	out = b.Return(2)
	require.Equal(t, []uint64{4}, out.Admitted, "p2's return admits p3's waiting move")
	for _, id := range []uint64{1, 2, 3, 4} {
		b.End(id)
	}
	require.True(t, b.Idle())

	off := New(0, 0, 0)
	require.Len(t, off.Submit("p", 1, chunks(10, 1<<20)).Chunks, 10)
}

// Ending a move removes its queued chunks only, and a move that ends
// while it waits for admission is not admitted later.
func TestEndKeepsOtherRuns(t *testing.T) {
	b := New(10, 0, 0)
	b.Submit("p", 1, chunks(3, 10))
	b.Submit("p", 2, chunks(2, 10))
	require.False(t, b.Admit("p", 3))
	require.False(t, b.Admit("p", 4))
	b.End(3)
	out := b.End(1)
	require.Len(t, out.Chunks, 1)
	require.EqualValues(t, 2, out.Chunks[0].Run)
	out = b.End(2)
	require.Equal(t, []uint64{4}, out.Admitted, "the move that ended waiting is not admitted")
	b.End(4)
	require.True(t, b.Idle())
}

// A lost connection gives back what the target did not credit and drops
// the queued chunks; the resend counts from what the target credited, and
// its credits (which count resent chunks) return the budget again.
func TestLostConnectionGivesBackTheUncredited(t *testing.T) {
	b := New(100, 0, 0)
	require.True(t, b.Admit("p", 1))
	require.Len(t, b.Submit("p", 1, chunks(4, 40)).Chunks, 2)
	require.Len(t, b.Credit(1, 40).Chunks, 1)
	require.False(t, b.Admit("p", 2), "a chunk of move 1 still queues")
	out := b.LostPeer("p")
	require.Empty(t, out.Chunks, "the queued chunk is dropped")
	require.Equal(t, []uint64{2}, out.Admitted, "nothing of move 1 is in flight or queued any more")
	require.Len(t, b.Submit("p", 1, chunks(3, 40)).Chunks, 2, "the resend starts from an empty budget")
	out = b.Credit(1, 40+80)
	require.Len(t, out.Chunks, 1, "the resent chunks' credit lets the last go")
	require.Empty(t, b.Return(1).Chunks)
	require.Empty(t, b.Credit(1, 400).Chunks, "a credit after the return changes nothing")
	b.End(1)
	b.End(2)
	require.True(t, b.Idle())
}

// A lost connection gives back every move's budget to the peer before
// any resends: one move's release does not send another's queued chunks,
// which that one would then count lost and send twice.
func TestALostConnectionSendsNoQueuedChunkBeforeTheResends(t *testing.T) {
	b := New(1000, 0, 50)
	require.Len(t, b.Submit("p", 1, chunks(1, 40)).Chunks, 1)
	require.Empty(t, b.Submit("p", 2, chunks(2, 40)).Chunks, "the window holds move 2's chunks")
	out := b.LostPeer("p")
	require.Empty(t, out.Chunks, "move 2 resends its own")
	require.Zero(t, b.InFlight("p"))
	require.Len(t, b.Submit("p", 1, chunks(1, 40)).Chunks, 1)
	require.Empty(t, b.Submit("p", 2, chunks(2, 40)).Chunks)
	require.Empty(t, b.Stalled())
}

// The chunk window paces an admitted payload within a larger budget: no
// more than the window is handed to the peer uncredited, each credit lets
// the next chunk go, the first chunk always goes, and admission still
// follows the budget and the queue.
// Reference: PROTOCOL.md §5.3 (ChunkWindow).
func TestChunkWindowPacesWithinTheBudget(t *testing.T) {
	b := New(1000, 0, 100)
	sent := b.Submit("p", 1, chunks(10, 40)).Chunks // 400 bytes, admitted against 1,000
	require.Len(t, sent, 2, "two 40-byte chunks fit a 100-byte window")
	require.False(t, b.Admit("p", 2), "a second move waits while the first one's chunks queue")
	total, credited := len(sent), uint64(0)
	var admitted []uint64
	for total < 10 {
		require.Empty(t, admitted, "admitted while chunks still queue")
		credited += 40
		out := b.Credit(1, credited)
		require.Len(t, out.Chunks, 1, "each credit lets one chunk go")
		total += len(out.Chunks)
		admitted = append(admitted, out.Admitted...)
	}
	require.Equal(t, []uint64{2}, admitted, "admitted once the queue has drained, within the budget")

	wide := New(1000, 0, 10)
	require.Len(t, wide.Submit("p", 1, chunks(3, 50)).Chunks, 1, "a chunk larger than the window goes when nothing is in flight")
}

// Moves asked for together are not all admitted at once: each sealing move
// holds a reserve of its peer's budget (one window; the whole budget
// without one) until its chunks are submitted and known to fit, so a
// burst waits before its seals, not inside its pauses with its chunks
// queued. A move that ends before its chunks returns its reserve.
// Reference: PROTOCOL.md §5.3.
func TestABurstIsAdmittedOneSealAtATime(t *testing.T) {
	b := New(100, 0, 0)
	require.True(t, b.Admit("p", 1))
	require.False(t, b.Admit("p", 2), "move 1 is sealing: its chunks are not known yet")
	require.False(t, b.Admit("p", 3))
	require.True(t, b.Admit("q", 9), "another peer's moves do not wait for p's")
	out := b.Submit("p", 1, chunks(1, 40))
	require.Len(t, out.Chunks, 1)
	require.Equal(t, []uint64{2}, out.Admitted, "40 of 100 in flight: the next move seals")
	out = b.Submit("p", 2, chunks(2, 40))
	require.Len(t, out.Chunks, 1, "80 in flight; the second chunk would pass 100")
	require.Empty(t, out.Admitted, "move 2's chunk queues: move 3 waits, still serving")
	out = b.Credit(2, 40)
	require.Len(t, out.Chunks, 1)
	require.Equal(t, []uint64{3}, out.Admitted, "80 of 100 in flight and nothing queued: move 3 seals")
	require.Empty(t, b.Stalled())

	c := New(100, 0, 0)
	require.True(t, c.Admit("p", 1))
	require.False(t, c.Admit("p", 2))
	require.Equal(t, []uint64{2}, c.End(1).Admitted, "move 1 failed before its chunks")

	// With a window, each sealing move holds one window of the budget: a
	// few seal at once, so one slow turn does not hold the rest.
	w := New(100, 0, 30)
	for id := uint64(1); id <= 4; id++ {
		require.True(t, w.Admit("p", id), "move %d: %d of 100 held by sealing moves", id, 30*(id-1))
	}
	require.False(t, w.Admit("p", 5), "four windows of 30 are held")
	require.Equal(t, []uint64{5}, w.End(2).Admitted)
}
