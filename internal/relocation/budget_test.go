package relocation

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

// A new unit is admitted at once while the peer's budget has room and
// waits, before its seal, while it is full; chunks go out as credit
// returns, and a payload larger than the budget still flows.
// Reference: docs/PROTOCOL.md §5.3.
func TestBudgetAdmissionAndPacing(t *testing.T) {
	b := newBudget(100, 0, 0)
	admitted := 0
	b.admit("p", func() { admitted++ })
	require.Equal(t, 1, admitted)

	sent := b.submit("p", 1, chunks(5, 60)) // 300 bytes against a 100-byte budget
	require.Len(t, sent, 1, "one chunk fits; the first always goes")
	b.admit("p", func() { admitted++ })
	require.Equal(t, 1, admitted, "a second unit waits while the budget is full")

	total := len(sent)
	var waiting []func()
	for total < 5 {
		require.Empty(t, waiting, "admitted while chunks still queue")
		more, w := b.release("p", 60)
		require.NotEmpty(t, more)
		total += len(more)
		waiting = append(waiting, w...)
	}
	require.Len(t, waiting, 1, "the waiting unit is admitted once the queue has drained and there is room")
	waiting[0]()
	require.Equal(t, 2, admitted)
}

// The node-wide budget limits every peer together; 0 turns a budget off.
// Reference: PROTOCOL.md §5.3 (RelocationNodeInFlightPayloadBudget).
func TestNodeBudgetSpansPeers(t *testing.T) {
	b := newBudget(0, 100, 0)
	require.Len(t, b.submit("p1", 1, chunks(1, 80)), 1)
	require.Empty(t, b.submit("p2", 2, chunks(1, 80)), "the node budget is spent")
	_, _ = b.release("p1", 80)
	require.Len(t, b.pump("p2"), 1)

	off := newBudget(0, 0, 0)
	require.Len(t, off.submit("p", 1, chunks(10, 1<<20)), 10)
}

// Dropping a finished run removes its queued chunks only.
func TestBudgetDropKeepsOtherRuns(t *testing.T) {
	b := newBudget(10, 0, 0)
	b.submit("p", 1, chunks(3, 10))
	b.submit("p", 2, chunks(2, 10))
	b.drop("p", 1)
	more, _ := b.release("p", 10)
	require.Len(t, more, 1)
	require.EqualValues(t, 2, more[0].run)
}

// The chunk window paces an admitted payload within a larger budget: no
// more than the window is handed to the peer's connection uncredited (so
// other messages never queue behind a whole payload), each credit lets the
// next chunk go, the first chunk always goes, and admission still follows
// the budget and the queue.
// Reference: PROTOCOL.md §5.3 (ChunkWindow).
func TestChunkWindowPacesWithinTheBudget(t *testing.T) {
	b := newBudget(1000, 0, 100)
	sent := b.submit("p", 1, chunks(10, 40)) // 400 bytes, admitted against 1,000
	require.Len(t, sent, 2, "two 40-byte chunks fit a 100-byte window")
	admitted := 0
	b.admit("p", func() { admitted++ })
	require.Zero(t, admitted, "a second unit waits while the first one's chunks queue")
	total := len(sent)
	for total < 10 {
		require.Zero(t, admitted, "admitted while chunks still queue")
		more, w := b.release("p", 40)
		require.Len(t, more, 1, "each credit lets one chunk go")
		total += len(more)
		for _, a := range w {
			a()
		}
	}
	require.Equal(t, 1, admitted, "admitted once the queue has drained, within the budget")

	wide := newBudget(1000, 0, 10)
	require.Len(t, wide.submit("p", 1, chunks(3, 50)), 1, "a chunk larger than the window goes when nothing is in flight")
}
