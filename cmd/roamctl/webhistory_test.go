package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The charts' history: each move counted once however many reads see it,
// in the step it was committed in, with its step's pause p50 and p99; each
// node's load sampled at every read; all of it for historyWindow only.
func TestWebHistoryCountsEachMoveOnceAndForgetsTheOld(t *testing.T) {
	c, _, _ := testCtl(manualStore())
	v := c.newWebView()
	t0 := time.UnixMilli(1_000_000_000_000) // a step boundary
	at := func(d time.Duration) string { return t0.Add(d).UTC().Format(time.RFC3339Nano) }
	read := func(now time.Duration, moves []moveLine, loads ...int) *history {
		s := &webState{allMoves: moves}
		for i, l := range loads {
			s.Nodes = append(s.Nodes, nodeJSON{Mesh: "m", Name: []string{"a", "b"}[i], Rid: []string{"rid-a", "rid-b"}[i], Load: l})
		}
		v.record(s, t0.Add(now))
		return v.history(t0.Add(now))
	}
	var moves []moveLine
	for i := range 100 {
		moves = append(moves, moveLine{Mesh: "m", ToRid: "rid-b", Seq: uint64(i + 1), At: at(time.Duration(i) * 10 * time.Millisecond), PauseMs: float64(i + 1)})
	}
	moves = append(moves, moveLine{Mesh: "m", ToRid: "rid-a", Seq: 1, At: at(6 * time.Second), PauseMs: 7})
	h := read(7*time.Second, moves, 10, 0)
	h = read(8*time.Second, moves, 9, 1) // the same moves read again
	require.Len(t, h.Steps, int(historyWindow/stepEvery))
	last, prev := h.Steps[len(h.Steps)-1], h.Steps[len(h.Steps)-2]
	require.Equal(t, t0.Add(10*time.Second).UnixMilli(), last.EndMs, "the last step ends after the read")
	require.Equal(t, 1, last.Moves)
	require.Equal(t, 100, prev.Moves)
	require.Equal(t, 50.0, *prev.P50Ms)
	require.Equal(t, 99.0, *prev.P99Ms)
	require.Nil(t, h.Steps[0].P50Ms, "a step without moves has no pause")
	require.Len(t, h.Load, 2)
	require.Equal(t, [][2]int64{{t0.Add(7 * time.Second).UnixMilli(), 10}, {t0.Add(8 * time.Second).UnixMilli(), 9}}, h.Load[0].Points)
	require.Equal(t, "b", h.Load[1].Node)

	// Past the window: the old moves and samples are gone; a node that
	// left has no series.
	h = read(historyWindow+9*time.Second, moves, 4)
	total := 0
	for _, s := range h.Steps {
		total += s.Moves
	}
	require.Zero(t, total)
	require.Empty(t, v.seenMoves)
	require.Len(t, h.Load, 1)
	require.Len(t, h.Load[0].Points, 1)
}
