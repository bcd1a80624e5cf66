package faulty_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/location/storetest"
)

// With no faults configured the wrapper passes the RootStore contract
// (docs/PROTOCOL.md §3.5) of the store it wraps.
func TestRootContractWithoutFaults(t *testing.T) {
	storetest.RunRoots(t, storetest.Harness{
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

// Root calls draw faults like the others: PutRoot and DeleteRoot are
// writes, GetRoot is a read. Reference: PROTOCOL.md §3.3, §3.5.
func TestInjectedFaultsOnRoots(t *testing.T) {
	inner := memstore.New()
	s, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	ctx := context.Background()

	s.Inject(faulty.Unavailable, faulty.IndeterminateLost, faulty.IndeterminateApplied)
	_, err = s.PutRoot(ctx, "r", []byte("x"))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, err = s.PutRoot(ctx, "r", []byte("x"))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	_, _, err = inner.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrNotFound)
	_, err = s.PutRoot(ctx, "r", []byte("x"))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	got, ref, err := inner.GetRoot(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, []byte("x"), got)

	s.Inject(faulty.IndeterminateApplied)
	_, _, err = s.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrUnavailable, "a read cannot be indeterminate")
	got, ref2, err := s.GetRoot(ctx, "r")
	require.NoError(t, err)
	require.Equal(t, []byte("x"), got)
	require.Equal(t, ref, ref2)

	s.Inject(faulty.IndeterminateLost)
	require.ErrorIs(t, s.DeleteRoot(ctx, "r"), location.ErrIndeterminate)
	_, _, err = inner.GetRoot(ctx, "r")
	require.NoError(t, err)
	require.NoError(t, s.DeleteRoot(ctx, "r"))
	_, _, err = inner.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrNotFound)
}

// plain is a Location Store that keeps no roots.
type plain struct{ location.Store }

// Wrapping a store that keeps no roots: the root calls are ErrInvalid and
// draw no fault.
func TestRootsOfStoreWithoutRoots(t *testing.T) {
	s, err := faulty.New(plain{memstore.New()}, faulty.Config{Unavailable: 1})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.PutRoot(ctx, "r", nil)
	require.ErrorIs(t, err, location.ErrInvalid)
	_, _, err = s.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrInvalid)
	require.ErrorIs(t, s.DeleteRoot(ctx, "r"), location.ErrInvalid)
	require.Zero(t, s.Stats().Calls)
}
