package sourcerun

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/handoff"
)

// Only the moves out to the lost peer are told, each once, with
// ConnectionLost.
func TestConnectionLostTellsTheMovesToThePeer(t *testing.T) {
	type run struct{ target string }
	runs := []*run{{"a"}, {"b"}, {"a"}}
	var told []*run
	ConnectionLost(slices.Values(runs), func(r *run) bool { return r.target == "a" }, func(r *run, ev handoff.Event) {
		require.IsType(t, handoff.ConnectionLost{}, ev)
		told = append(told, r)
	})
	require.Equal(t, []*run{runs[0], runs[2]}, told)
}
