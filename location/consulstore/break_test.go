package consulstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

func breakNode(rid, name string) *location.NodeDescriptor {
	return &location.NodeDescriptor{
		Mesh: "mesh", Name: name, NodeRid: rid, NodeGeneration: 1, EntrySpotId: "roam-entry-" + rid,
		Address: "127.0.0.1:7000", Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1,
	}
}

// Node names on both stores: racing claims, odd bytes, reuse once the
// holder's lease expired (a crash, no release).
func TestBreakNodeNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) location.Store
	}{
		{"memstore", func(*testing.T) location.Store { return memstore.New() }},
		{"consul", func(t *testing.T) location.Store { return newStore(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := tc.store(t)

			// 16 nodes race for one name: exactly one wins, the others
			// are ErrNodeNameTaken and leave nothing behind.
			var wins, taken atomic.Int64
			var wg sync.WaitGroup
			for i := 0; i < 16; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.ClaimNode(ctx, breakNode(fmt.Sprintf("race-%d", i), "contested"), time.Second)
					switch {
					case err == nil:
						wins.Add(1)
					case errors.Is(err, location.ErrNodeNameTaken):
						taken.Add(1)
					default:
						t.Errorf("claim: %v", err)
					}
				}()
			}
			wg.Wait()
			require.EqualValues(t, 1, wins.Load())
			require.EqualValues(t, 15, taken.Load())
			nodes, err := s.ListNodes(ctx, "mesh")
			require.NoError(t, err)
			require.Len(t, nodes, 1)

			// Odd names: each one claimable, and distinct from its
			// look-alikes (escaping must not merge two names).
			odd := []string{"a/b", "a%2Fb", "..", ".", "a b", "ünï", "%", "%25", strings.Repeat("/", 255), strings.Repeat("é", 127)}
			for i, n := range odd {
				_, err := s.ClaimNode(ctx, breakNode(fmt.Sprintf("odd-%d", i), n), 10*time.Second)
				require.NoError(t, err, "name %q", n)
			}
			nodes, err = s.ListNodes(ctx, "mesh")
			require.NoError(t, err)
			got := map[string]bool{}
			for _, n := range nodes {
				got[n.Node.GetName()] = true
			}
			for _, n := range odd {
				require.True(t, got[n], "name %q listed", n)
			}

			// The winner "crashes": its lease is never renewed. Its name is
			// free once the store ends the lease (Consul: TTL..2×TTL).
			attempt := 0
			testwait.For(t, func() bool {
				attempt++
				_, err := s.ClaimNode(ctx, breakNode(fmt.Sprintf("after-%d", attempt), "contested"), time.Second)
				if err != nil {
					require.ErrorIs(t, err, location.ErrNodeNameTaken)
				}
				return err == nil
			}, "a crashed node's name never became free")
		})
	}
}
