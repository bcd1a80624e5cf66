package spot_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// leftRootStore is a memstore on which the recovery root a reservation
// writes in its own transaction is already there, with the same bytes,
// when the transaction runs: as an earlier attempt of the same activation
// leaves it when its reservation was lost and its root's delete failed.
type leftRootStore struct {
	*memstore.Store
	left atomic.Int64 // roots put ahead of their transaction
}

func (s *leftRootStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if op.Kind == location.OpCreateRoot {
			if _, err := s.Store.PutRoot(ctx, op.RootKey, op.Data); err != nil {
				return nil, err
			}
			s.left.Add(1)
		}
	}
	return s.Store.Apply(ctx, ops)
}

// A cold activation whose recovery root is already stored under its key
// with the same bytes still activates the Spot: the reservation's
// transaction fails on the root alone, the root is taken as stored (as
// PutRoot takes identical bytes), and the reservation is written without
// it. The first message is handled once.
// Reference: docs/PROTOCOL.md §7.5 step 9; location.OpCreateRoot.
func TestAnActivationRootLeftBehindIsTakenAsStored(t *testing.T) {
	store := &leftRootStore{Store: memstore.New()}
	w := newWorld(t, store)
	w.startN(2)
	for i, id := range []string{"cart-a", "cart-b", "cart-c"} {
		reply, err := w.nodes[i%2].Spots().Request(id, wrapperspb.String("first")).InstanceSpot("cart").Timeout(10 * time.Second).Do(context.Background())
		require.NoError(t, err, id)
		require.NotNil(t, reply)
		require.Equal(t, []string{"first"}, w.handledOf(id), id)
	}
	require.EqualValues(t, 3, store.left.Load(), "every reservation carried its root and found it stored")
	require.EqualValues(t, 3, w.count("cart").Load())
}

// valueStore is a store that is a struct value holding a slice: comparing
// two interfaces holding it panics, so nothing may compare it.
type valueStore struct {
	*memstore.Store
	tags []string
}

// A node whose store is a struct value that Go cannot compare starts and
// activates Spots (its roots then go through PutRoot).
func TestAStoreOfAnUncomparableTypeIsAccepted(t *testing.T) {
	w := newWorld(t, valueStore{Store: memstore.New(), tags: []string{"x"}})
	w.start()
	_, err := w.nodes[0].Spots().Request("cart-v", wrapperspb.String("first")).InstanceSpot("cart").Timeout(10 * time.Second).Do(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"first"}, w.handledOf("cart-v"))
}
