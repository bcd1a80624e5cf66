package sourcerun

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/handoff"
)

// Only the moves out to the lost peer are told, each once, with
// ConnectionLost, after the budget was given back.
func TestConnectionLostTellsTheMovesToThePeer(t *testing.T) {
	type run struct{ target string }
	runs := []*run{{"a"}, {"b"}, {"a"}}
	var told []*run
	gaveBack := false
	ConnectionLost(slices.Values(runs), func(r *run) bool { return r.target == "a" }, func() { gaveBack = true }, func(r *run, ev handoff.Event) {
		require.True(t, gaveBack, "the budget is given back before any move resends")
		require.IsType(t, handoff.ConnectionLost{}, ev)
		told = append(told, r)
	})
	require.Equal(t, []*run{runs[0], runs[2]}, told)
}
