package budget

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Under a node budget a chunk that only the node's bound holds back is
// not passed by the chunks and moves of a peer that keeps the node's
// budget busy: without that, a stream of moves to one peer starved a
// sealed move to another until its restore deadline failed it, though
// the budget never fails a move that has started.
// Reference: docs/PROTOCOL.md §5.3.
func TestNodeBudgetServesChunksInSubmissionOrder(t *testing.T) {
	b := New(0, 100, 0)
	require.True(t, b.Admit("B", 1))
	require.Len(t, b.Submit("B", 1, chunks(4, 50)).Chunks, 2, "B's first two chunks fill the node's budget")
	require.False(t, b.Admit("B", 2), "B's queue is not empty")
	require.False(t, b.Admit("A", 10), "the node's budget is full")
	var credited uint64
	out := b.Credit(1, 50) // B's third chunk goes; the node is full again
	credited += 50
	require.Len(t, out.Chunks, 1)
	out = b.Credit(1, credited+50) // B's fourth goes; B's queue drains
	credited += 50
	require.Len(t, out.Chunks, 1)
	// B's credits keep coming; once B's queue is empty, A is admitted
	// and its 60-byte chunk needs 60 of the node's 100 bytes.
	out = b.Credit(1, credited+50)
	require.Equal(t, []uint64{2, 10}, out.Admitted, "B's queue is empty and the node's budget has room")
	require.Empty(t, b.Submit("A", 10, chunks(1, 60)).Chunks, "50 in flight: A's chunk waits for the node's budget")
	require.Empty(t, b.Submit("B", 2, chunks(4, 50)).Chunks, "B's later chunks do not pass A's")
	require.False(t, b.Admit("B", 3), "a new move waits while a chunk waits for the node's budget")
	out = b.Return(1) // B's last chunk returns: the node is idle
	require.Len(t, out.Chunks, 1)
	require.EqualValues(t, 10, out.Chunks[0].Run, "A's chunk goes first")
	for _, id := range []uint64{1, 2, 3, 10} {
		b.End(id)
	}
	require.True(t, b.Idle())
}
