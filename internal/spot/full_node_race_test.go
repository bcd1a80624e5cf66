package spot_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// raceReadStore is a memstore whose first read of one Instance Spot key
// waits until the test lets it answer (all closed): callers that need the
// ID's route meanwhile share that read (Manager.readRouteAuthority), so
// they all read the ID Missing before any activation reserves it (the
// concurrent first messages of §7.6).
type raceReadStore struct {
	*memstore.Store
	key     location.AuthorityKey
	arrived atomic.Int64
	all     chan struct{}
}

func (s *raceReadStore) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key == s.key && s.arrived.Add(1) == 1 {
		select {
		case <-s.all:
		case <-ctx.Done():
			return location.Versioned{}, ctx.Err()
		}
	}
	return s.Store.Read(ctx, key)
}

// ReadKeys reads each key through Read, so a read of several keys at
// once (location.KeysReader, as the embedded store has) meets it too.
func (s *raceReadStore) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	return location.ReadKeysByRead(ctx, s.Read, keys...)
}

// Two callers send first messages to one Missing Instance Spot at once:
// both read it Missing, both send a SpotActivation that says so to the
// same target. The first activates the Spot and fills the (bounded) node.
// The second, refused a creation slot on its attempt without a read, reads,
// finds the Spot Ready and forwards its first message to it: a message for
// an existing Spot needs no slot.
// Reference: docs/PROTOCOL.md §7.5 steps 8–9, §7.6.
func TestAConcurrentFirstMessageOnAFullNodeIsForwarded(t *testing.T) {
	store := &raceReadStore{Store: memstore.New(), key: location.Key(location.KindInstanceSpot, "race"), all: make(chan struct{})}
	w := newWorld(t, store)
	// Capacity 1: room for exactly the one Spot both callers want.
	n := w.start(withCapacity(1))

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = n.Spots().Request("race", wrapperspb.String([]string{"m1", "m2"}[i])).InstanceSpot("cart").
				Timeout(10 * time.Second).Do(context.Background())
		}(i)
	}
	w.eventually(t, "the second caller waiting on the first one's read", func() bool {
		return spot.RouteReadSharers(n.Spots(), "race") == 1
	})
	close(store.all)
	wg.Wait()
	require.NoError(t, errs[0], "first caller")
	require.NoError(t, errs[1], "second caller")
	require.ElementsMatch(t, []string{"m1", "m2"}, w.handledOf("race"))
	require.EqualValues(t, 1, w.count("cart").Load())
}
