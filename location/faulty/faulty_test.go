package faulty_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/location/storetest"
	"github.com/roamactors/roam/messages"
)

func rec(gen uint64) *location.Record {
	return &location.Record{ObjectGeneration: gen, State: messages.LifecycleState_LIFECYCLE_STATE_READY}
}

// With no faults configured the wrapper is the store: it passes the whole
// contract suite.
func TestContractWithoutFaults(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t testing.TB) storetest.Instance {
			clock := memstore.NewManualClock()
			s, err := faulty.New(memstore.New(memstore.WithClock(clock)), faulty.Config{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			return storetest.Instance{Store: s, Pass: clock.Advance}
		},
		LeaseTTL: 10 * time.Second,
	})
}

// Each scripted fault does what it says to the write underneath.
// Reference: docs/PROTOCOL.md §3.3, §6.3 (store unavailable, indeterminate write).
func TestInjectedFaultsApplyOrNot(t *testing.T) {
	inner := memstore.New()
	s, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	key := location.Key(location.KindActor, "a")

	s.Inject(faulty.Unavailable, faulty.IndeterminateLost, faulty.IndeterminateApplied)
	_, err = s.CompareAndSet(ctx, key, 0, rec(1))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, err = inner.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound)

	_, err = s.CompareAndSet(ctx, key, 0, rec(1))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	_, err = inner.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound)

	_, err = s.CompareAndSet(ctx, key, 0, rec(1))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	got, err := inner.Read(ctx, key)
	require.NoError(t, err)
	require.EqualValues(t, 1, got.Record.GetObjectGeneration())

	// The script is used up: the next call passes.
	_, err = s.CompareAndSet(ctx, key, got.Version, rec(2))
	require.NoError(t, err)
	require.Equal(t, faulty.Stats{Calls: 4, Unavailable: 1, IndeterminateApplied: 1, IndeterminateLost: 1,
		ByOp: map[string]int{"compare-and-set": 4}}, s.Stats())

	// A read cannot be indeterminate: it is made unavailable.
	s.Inject(faulty.IndeterminateApplied)
	_, err = s.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrUnavailable)
}

// The same seed draws the same faults in the same order.
func TestSeedRepeats(t *testing.T) {
	draw := func(seed uint64) []string {
		s, err := faulty.New(memstore.New(), faulty.Config{Seed: seed, Unavailable: 0.2, IndeterminateApplied: 0.2, IndeterminateLost: 0.2})
		require.NoError(t, err)
		var out []string
		for i := 0; i < 64; i++ {
			_, err := s.CompareAndSet(context.Background(), location.Key(location.KindActor, fmt.Sprint(i)), 0, rec(1))
			out = append(out, fmt.Sprint(err))
		}
		return out
	}
	a, b, c := draw(42), draw(42), draw(43)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
}

func TestConfigValidated(t *testing.T) {
	for _, cfg := range []faulty.Config{{Unavailable: -0.1}, {Unavailable: 0.6, IndeterminateLost: 0.6}, {MaxLatency: -1}} {
		_, err := faulty.New(memstore.New(), cfg)
		require.ErrorIs(t, err, location.ErrInvalid)
	}
}
