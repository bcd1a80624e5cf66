package meshnode_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// Finding: a node verified moments ago is cached by address for
// memberFresh (1 s); a new lifecycle at the same address (a restart on a
// fixed port, or the in-place rejoin, which keeps the address) is refused
// as ErrNotMember — PermissionDenied, a class that says "retrying with the
// same credentials cannot succeed" — without the store being asked,
// because verify compares the cached descriptor's RID and generation and
// refuses on a mismatch instead of reading again. Capability queries (so
// every move from that node), forwarded Relocates and Spot commands from
// it fail so.
func TestBreakNewLifecycleAtACachedAddressIsRefused(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	n, err := meshnode.Start(ctx, meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(ctx) })

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	old, err := meshnode.Start(ctx, meshnode.Config{Store: store, Port: port})
	require.NoError(t, err)
	od := old.Descriptor()
	require.NoError(t, n.VerifyPeer(ctx, od.GetNodeRid(), od.GetNodeGeneration(), od.GetAddress()))

	began := time.Now()
	require.NoError(t, old.Stop(ctx))
	// The stopped remote may hold its port a little longer (its listener
	// closes after Stop returns): start again once the port is free.
	var fresh *meshnode.Node
	testwait.For(t, func() bool {
		fresh, err = meshnode.Start(ctx, meshnode.Config{Store: store, Port: port})
		if err != nil && strings.Contains(err.Error(), "address already in use") {
			return false
		}
		require.NoError(t, err)
		return true
	}, "the old lifecycle's port is free again")
	t.Cleanup(func() { _ = fresh.Stop(ctx) })
	fd := fresh.Descriptor()
	require.Equal(t, od.GetAddress(), fd.GetAddress())
	err = n.VerifyPeer(ctx, fd.GetNodeRid(), fd.GetNodeGeneration(), fd.GetAddress())
	t.Logf("restart took %v; verify of the new lifecycle: %v", time.Since(began), err)
	require.NoError(t, err, "a live member, claimed in the store, refused")
}
