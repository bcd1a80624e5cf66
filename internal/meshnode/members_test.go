package meshnode_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// countingStore counts the node lookups a node makes, and can fail lists.
type countingStore struct {
	location.Store
	lists, reads atomic.Int64
	failLists    atomic.Bool
}

func (s *countingStore) ListNodes(ctx context.Context, mesh string) ([]location.VersionedNode, error) {
	s.lists.Add(1)
	if s.failLists.Load() {
		return nil, fmt.Errorf("%w: injected", location.ErrUnavailable)
	}
	return s.Store.ListNodes(ctx, mesh)
}

func (s *countingStore) ReadNode(ctx context.Context, key location.NodeKey) (location.VersionedNode, error) {
	s.reads.Add(1)
	return s.Store.ReadNode(ctx, key)
}

// A flood of control messages from addresses no node has costs the store
// a few shared lists, not a call each, and every one is refused as not a
// member; a node of another mesh is a member; a node that has left is
// not; a store that cannot list makes the answer Unavailable, never "not
// a member".
func TestMembershipIsCheckedAgainstTheStoreAndBounded(t *testing.T) {
	store := &countingStore{Store: memstore.New()}
	ctx := context.Background()
	n, err := meshnode.Start(ctx, meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(ctx) })
	peer, err := meshnode.Start(ctx, meshnode.Config{Store: store, Mesh: "other"})
	require.NoError(t, err)
	pd := peer.Descriptor()

	require.NoError(t, n.VerifyPeer(ctx, pd.GetNodeRid(), pd.GetNodeGeneration(), pd.GetAddress()), "a node of another mesh")
	require.ErrorIs(t, n.VerifyPeer(ctx, pd.GetNodeRid(), pd.GetNodeGeneration()+1, pd.GetAddress()), meshnode.ErrNotMember, "another lifecycle")
	require.ErrorIs(t, n.VerifyPeer(ctx, pd.GetNodeRid(), pd.GetNodeGeneration(), "127.0.0.1:1"), meshnode.ErrNotMember, "another address")

	before := store.lists.Load() + store.reads.Load()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.VerifyPeer(ctx, fmt.Sprintf("rid-%d", i), 1, fmt.Sprintf("127.0.0.1:%d", 2+i))
			if err != nil && roamerr.Code(err) == roamerr.CodePermissionDenied {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 200, refused.Load())
	require.LessOrEqual(t, store.lists.Load()+store.reads.Load()-before, int64(3), "lists are shared by everyone waiting")

	// A node that left stops being one once its cached answer (1 s) ages.
	require.NoError(t, peer.Stop(ctx))
	testwait.For(t, func() bool {
		_, err := n.PeerAt(ctx, pd.GetAddress())
		return errors.Is(err, meshnode.ErrNotMember)
	}, "a node that left is still taken for a member")

	store.failLists.Store(true)
	_, err = n.PeerAt(ctx, "127.0.0.1:9")
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.NotErrorIs(t, err, meshnode.ErrNotMember)
}
