package memstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/location/storetest"
)

// TestRootContract runs the RootStore contract suite (docs/PROTOCOL.md §3.5) on the
// embedded store.
func TestRootContract(t *testing.T) { storetest.RunRoots(t, harness()) }

// A closed store answers root calls as it answers every other call:
// ErrUnavailable (PROTOCOL.md §3.5).
func TestRootCallsOnClosedStoreAreUnavailable(t *testing.T) {
	s := memstore.New()
	ctx := context.Background()
	_, err := s.PutRoot(ctx, "r", []byte("x"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = s.PutRoot(ctx, "r2", []byte("x"))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, _, err = s.GetRoot(ctx, "r")
	require.ErrorIs(t, err, location.ErrUnavailable)
	require.ErrorIs(t, s.DeleteRoot(ctx, "r"), location.ErrUnavailable)
	_, err = s.Read(ctx, location.Key(location.KindActor, "a"))
	require.ErrorIs(t, err, location.ErrUnavailable, "the same class as the store's other calls")
}

// TestCheckpointCheckInApply runs the OpCheckNoCheckpoint contract.
func TestCheckpointCheckInApply(t *testing.T) { storetest.RunCheckpointsInApply(t, harness()) }

// TestCheckpointContract runs the checkpoint store contract on the
// embedded store.
func TestCheckpointContract(t *testing.T) {
	storetest.RunCheckpoints(t, storetest.CheckpointStoreOf(harness()))
}

func BenchmarkCheckpointPut(b *testing.B) { storetest.BenchmarkCheckpointPut(b, memstore.New()) }
