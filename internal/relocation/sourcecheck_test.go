package relocation_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// A move's source check before the seal backs its Restore request: the
// target takes the record the check kept rather than reading the store
// between the seal and relay-ready, and the move commits at that
// record's version, back and forth.
// Reference: docs/PROTOCOL.md §5.2, §5.7.
func TestSourceCheckedMovesTakeTheKeptRecord(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	key := location.Key(location.KindActor, "prechecked")
	pid, err := c.nodes[0].driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	for n := int64(1); n <= 5; n++ {
		c.nodes[0].node.System().Root.Send(pid, wrapperspb.Int64(n))
	}
	require.Equal(t, int64(5), get(t, c.nodes[0].node.System(), pid))
	for i := 0; i < 4; i++ {
		out, err := c.nodes[i%2].driver.Relocate(ctx, key, c.rid((i+1)%2))
		require.NoError(t, err, "move %d", i)
		require.Equal(t, c.rid((i+1)%2), out.To)
	}
	require.Equal(t, 2, relocation.PrecheckedRestores(c.nodes[0].driver), "moves into node 0")
	require.Equal(t, 2, relocation.PrecheckedRestores(c.nodes[1].driver), "moves into node 1")
	require.Equal(t, int64(5), get(t, c.nodes[1].node.System(), pid), "the state moved each time (the old address follows)")
}
