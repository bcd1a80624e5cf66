package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
)

// The checkpoint store contract (location.CheckpointStore): a versioned
// blob per relocatable object, written by compare-and-set, never read torn.
// Any implementation — memstore, consulstore, an application's own blob
// store — passes it with RunCheckpoints.
var checkpointTests = []struct {
	name string
	run  func(t *testing.T, s location.CheckpointStore)
}{
	{"CheckpointRoundTripsAtEverySize", testCheckpointRoundTrip},
	{"CheckpointCreateOnlyWhenAbsent", testCheckpointCreateOnly},
	{"CheckpointCompareAndSetWinAndLose", testCheckpointCAS},
	{"CheckpointEveryWriteIsANewVersion", testCheckpointNewVersion},
	{"CheckpointRaceHasOneWinner", testCheckpointRace},
	{"CheckpointReadDuringReplaceIsWhole", testCheckpointReadDuringReplace},
	{"CheckpointOverLimitIsTooLargeAndNothingStored", testCheckpointTooLarge},
	{"CheckpointInvalidKeyRejected", testCheckpointInvalidKey},
	{"CheckpointGetMissingIsNotFound", testCheckpointGetMissing},
	{"CheckpointDeleteAtVersion", testCheckpointDelete},
	{"CheckpointKeysAreIndependent", testCheckpointKeysIndependent},
	{"CheckpointBytesAreCopied", testCheckpointCopied},
	{"CheckpointCallsWithEndedContextAreUnavailable", testCheckpointEndedContext},
}

// RunCheckpoints runs the checkpoint store contract; open returns a store
// over an empty namespace (the test cleans it up).
func RunCheckpoints(t *testing.T, open func(t testing.TB) location.CheckpointStore) {
	for _, tc := range checkpointTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
}

// CheckpointStoreOf returns a harness's store as a CheckpointStore, for
// RunCheckpoints.
func CheckpointStoreOf(h Harness) func(t testing.TB) location.CheckpointStore {
	return func(t testing.TB) location.CheckpointStore {
		in := h.New(t)
		t.Cleanup(func() { _ = in.Store.Close() })
		cs, ok := in.Store.(location.CheckpointStore)
		if !ok {
			t.Fatalf("%T does not implement location.CheckpointStore", in.Store)
		}
		return cs
	}
}

var cpKey = location.Key(location.KindInstanceSpot, "cart-1")

func cctx(t *testing.T) context.Context { return ctx(t) }

func requireCheckpoint(t *testing.T, s location.CheckpointStore, key location.AuthorityKey, want []byte, version location.StoreVersion) {
	t.Helper()
	got, v, err := s.GetCheckpoint(cctx(t), key)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "checkpoint of %s: %d bytes, want %d", key, len(got), len(want))
	if version != 0 {
		require.Equal(t, version, v)
	}
}

func requireNoCheckpoint(t *testing.T, s location.CheckpointStore, key location.AuthorityKey) {
	t.Helper()
	_, _, err := s.GetCheckpoint(cctx(t), key)
	require.ErrorIs(t, err, location.ErrNotFound)
}

// Sizes around an implementation's inline limit and part boundaries read
// back byte for byte, empty included.
func testCheckpointRoundTrip(t *testing.T, s location.CheckpointStore) {
	var v location.StoreVersion
	for i, n := range []int{0, 1, 1000, 128 << 10, 128<<10 + 1, 256 << 10, 256<<10 + 1, 700 << 10, 1<<20 + 3} {
		data := rootBytes(uint64(i+1), n)
		nv, err := s.PutCheckpoint(cctx(t), cpKey, v, data)
		require.NoError(t, err, "size %d", n)
		require.NotZero(t, nv)
		requireCheckpoint(t, s, cpKey, data, nv)
		v = nv
	}
	// and back down: a small checkpoint replaces a large one whole.
	nv, err := s.PutCheckpoint(cctx(t), cpKey, v, []byte("small"))
	require.NoError(t, err)
	requireCheckpoint(t, s, cpKey, []byte("small"), nv)
}

func testCheckpointCreateOnly(t *testing.T, s location.CheckpointStore) {
	v, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("first"))
	require.NoError(t, err)
	_, err = s.PutCheckpoint(cctx(t), cpKey, 0, []byte("second"))
	requireConflict(t, err)
	requireCheckpoint(t, s, cpKey, []byte("first"), v)
}

func testCheckpointCAS(t *testing.T, s location.CheckpointStore) {
	v1, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("a"))
	require.NoError(t, err)
	v2, err := s.PutCheckpoint(cctx(t), cpKey, v1, []byte("b"))
	require.NoError(t, err)
	require.NotEqual(t, v1, v2)
	// A writer that read v1 loses, at any size, and changes nothing.
	for _, n := range []int{3, 300 << 10} {
		_, err = s.PutCheckpoint(cctx(t), cpKey, v1, rootBytes(9, n))
		requireConflict(t, err)
		requireCheckpoint(t, s, cpKey, []byte("b"), v2)
	}
	// Expecting a version when none is stored loses too.
	_, err = s.PutCheckpoint(cctx(t), location.Key(location.KindActor, "none"), v2, []byte("x"))
	requireConflict(t, err)
	requireNoCheckpoint(t, s, location.Key(location.KindActor, "none"))
}

// Writing the same bytes again is a write: a new version, so a writer
// that read the old one loses.
func testCheckpointNewVersion(t *testing.T, s location.CheckpointStore) {
	seen := map[location.StoreVersion]bool{}
	var v location.StoreVersion
	for i := 0; i < 4; i++ {
		nv, err := s.PutCheckpoint(cctx(t), cpKey, v, []byte("same"))
		require.NoError(t, err)
		require.False(t, seen[nv], "version %d came twice", nv)
		seen[nv] = true
		v = nv
	}
	require.NoError(t, s.DeleteCheckpoint(cctx(t), cpKey, 0))
	nv, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("same"))
	require.NoError(t, err)
	require.False(t, seen[nv], "a version came again after a delete")
}

// Writers racing from one version: exactly one wins, and its bytes are
// stored.
func testCheckpointRace(t *testing.T, s location.CheckpointStore) {
	v0, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("base"))
	require.NoError(t, err)
	const writers = 6
	var wg sync.WaitGroup
	results := make([]error, writers)
	versions := make([]location.StoreVersion, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := 100 + i*(60<<10) // inline and multi-part writers alike
			versions[i], results[i] = s.PutCheckpoint(cctx(t), cpKey, v0, rootBytes(uint64(100+i), n))
		}(i)
	}
	wg.Wait()
	winner := -1
	for i, err := range results {
		if err == nil {
			require.Equal(t, -1, winner, "two writers won")
			winner = i
			continue
		}
		var ce *location.ConflictError
		require.True(t, errors.As(err, &ce), "writer %d: %v", i, err)
	}
	require.NotEqual(t, -1, winner, "no writer won")
	requireCheckpoint(t, s, cpKey, rootBytes(uint64(100+winner), 100+winner*(60<<10)), versions[winner])
}

// A reader racing a writer that replaces large checkpoints sees one
// complete checkpoint each time, never a mix.
func testCheckpointReadDuringReplace(t *testing.T, s location.CheckpointStore) {
	values := [][]byte{rootBytes(21, 600<<10), rootBytes(22, 300<<10), rootBytes(23, 10)}
	v, err := s.PutCheckpoint(cctx(t), cpKey, 0, values[0])
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i < 10; i++ {
			nv, err := s.PutCheckpoint(cctx(t), cpKey, v, values[i%len(values)])
			if err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
			v = nv
		}
	}()
	reads := 0
	for reading := true; reading; reads++ {
		select {
		case <-done:
			reading = false
		default:
		}
		got, _, err := s.GetCheckpoint(cctx(t), cpKey)
		require.NoError(t, err)
		match := false
		for _, want := range values {
			match = match || bytes.Equal(got, want)
		}
		require.True(t, match, "read %d: %d bytes that no write stored", reads, len(got))
	}
}

func testCheckpointTooLarge(t *testing.T, s location.CheckpointStore) {
	_, err := s.PutCheckpoint(cctx(t), cpKey, 0, make([]byte, location.MaxCheckpointBytes+1))
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireNoCheckpoint(t, s, cpKey)
}

func testCheckpointInvalidKey(t *testing.T, s location.CheckpointStore) {
	for _, k := range []location.AuthorityKey{location.Key(location.KindActor, ""), {Kind: 99, ID: "x"},
		location.Key(location.KindActor, string([]byte{0xff}))} {
		_, err := s.PutCheckpoint(cctx(t), k, 0, []byte("x"))
		require.ErrorIs(t, err, location.ErrInvalid, "%v", k)
		_, _, err = s.GetCheckpoint(cctx(t), k)
		require.ErrorIs(t, err, location.ErrInvalid, "%v", k)
		require.ErrorIs(t, s.DeleteCheckpoint(cctx(t), k, 0), location.ErrInvalid, "%v", k)
	}
}

func testCheckpointGetMissing(t *testing.T, s location.CheckpointStore) {
	requireNoCheckpoint(t, s, cpKey)
}

func testCheckpointDelete(t *testing.T, s location.CheckpointStore) {
	require.NoError(t, s.DeleteCheckpoint(cctx(t), cpKey, 0), "a missing checkpoint")
	v1, err := s.PutCheckpoint(cctx(t), cpKey, 0, rootBytes(3, 400<<10))
	require.NoError(t, err)
	v2, err := s.PutCheckpoint(cctx(t), cpKey, v1, rootBytes(4, 400<<10))
	require.NoError(t, err)
	requireConflict(t, s.DeleteCheckpoint(cctx(t), cpKey, v1))
	requireCheckpoint(t, s, cpKey, rootBytes(4, 400<<10), v2)
	require.NoError(t, s.DeleteCheckpoint(cctx(t), cpKey, v2))
	requireNoCheckpoint(t, s, cpKey)
	// created anew from nothing
	v3, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("again"))
	require.NoError(t, err)
	requireCheckpoint(t, s, cpKey, []byte("again"), v3)
}

func testCheckpointKeysIndependent(t *testing.T, s location.CheckpointStore) {
	keys := []location.AuthorityKey{
		location.Key(location.KindActor, "x"), location.Key(location.KindInstanceSpot, "x"),
		location.Key(location.KindUserSpot, "x"), location.Key(location.KindActor, "x/y"),
		location.Key(location.KindActor, "x%2Fy"),
	}
	for i, k := range keys {
		_, err := s.PutCheckpoint(cctx(t), k, 0, []byte(fmt.Sprint(i)))
		require.NoError(t, err, "%v", k)
	}
	require.NoError(t, s.DeleteCheckpoint(cctx(t), keys[0], 0))
	requireNoCheckpoint(t, s, keys[0])
	for i, k := range keys[1:] {
		requireCheckpoint(t, s, k, []byte(fmt.Sprint(i+1)), 0)
	}
}

func testCheckpointCopied(t *testing.T, s location.CheckpointStore) {
	data := []byte("original")
	_, err := s.PutCheckpoint(cctx(t), cpKey, 0, data)
	require.NoError(t, err)
	copy(data, "CHANGED!")
	got, _, err := s.GetCheckpoint(cctx(t), cpKey)
	require.NoError(t, err)
	require.Equal(t, "original", string(got))
	copy(got, "CHANGED!")
	requireCheckpoint(t, s, cpKey, []byte("original"), 0)
}

func testCheckpointEndedContext(t *testing.T, s location.CheckpointStore) {
	v, err := s.PutCheckpoint(cctx(t), cpKey, 0, []byte("kept"))
	require.NoError(t, err)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.PutCheckpoint(ended, cpKey, v, rootBytes(1, 300<<10))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, _, err = s.GetCheckpoint(ended, cpKey)
	require.ErrorIs(t, err, location.ErrUnavailable)
	require.ErrorIs(t, s.DeleteCheckpoint(ended, cpKey, 0), location.ErrUnavailable)
	requireCheckpoint(t, s, cpKey, []byte("kept"), v)
}

// BenchmarkCheckpointPut measures one checkpoint write by compare-and-set
// at the version the last one returned (the steady owner's write), for a
// small and a multi-part state.
func BenchmarkCheckpointPut(b *testing.B, s location.CheckpointStore) {
	for _, n := range []int{1 << 10, 300 << 10} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			key := location.Key(location.KindInstanceSpot, fmt.Sprintf("bench-%d", n))
			data := rootBytes(1, n)
			if err := s.DeleteCheckpoint(context.Background(), key, 0); err != nil { // a round before this one
				b.Fatal(err)
			}
			var v location.StoreVersion
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				nv, err := s.PutCheckpoint(context.Background(), key, v, data)
				if err != nil {
					b.Fatal(err)
				}
				v = nv
			}
		})
	}
}

// The contract of location.OpCheckNoCheckpoint, for a store that keeps its
// own checkpoints (memstore, consulstore): run on the Location Store
// suite's harness.
var checkpointInApplyTests = []contractTest{
	{"NoCheckpointCheckPassesWhenNoneIsStored", testNoCheckpointPasses},
	{"NoCheckpointCheckFailsItsTransactionOverAStoredCheckpoint", testNoCheckpointFails},
	{"NoCheckpointCheckTwiceIsInvalid", testNoCheckpointTwice},
}

// RunCheckpointsInApply runs the OpCheckNoCheckpoint contract against h,
// whose stores must implement location.CheckpointStore.
func RunCheckpointsInApply(t *testing.T, h Harness) {
	for _, tc := range checkpointInApplyTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, h) })
	}
}

func applyCheckpoints(t *testing.T, h Harness) (location.Store, location.CheckpointStore) {
	t.Helper()
	in := open(t, h)
	c, ok := in.Store.(location.CheckpointStore)
	require.True(t, ok, "%T does not implement location.CheckpointStore", in.Store)
	return in.Store, c
}

// With no checkpoint of the key, the check passes: alone, and beside a
// write of the key's record.
func testNoCheckpointPasses(t *testing.T, h Harness) {
	s, _ := applyCheckpoints(t, h)
	k := location.Key(location.KindInstanceSpot, "fresh")
	_, err := s.Apply(ctx(t), []location.Op{location.CheckNoCheckpointOp(k)})
	require.NoError(t, err)
	vs, err := s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CheckNoCheckpointOp(k)})
	require.NoError(t, err)
	got, err := s.Read(ctx(t), k)
	require.NoError(t, err)
	require.Equal(t, vs[0], got.Version)
}

// A stored checkpoint fails the check, whatever its bytes, and the
// transaction applies nothing; once it is deleted the check passes.
func testNoCheckpointFails(t *testing.T, h Harness) {
	s, c := applyCheckpoints(t, h)
	k := location.Key(location.KindInstanceSpot, "checkpointed")
	other := location.Key(location.KindInstanceSpot, "other")
	for _, data := range [][]byte{nil, []byte("state"), rootBytes(5, 300<<10)} {
		v, err := c.PutCheckpoint(ctx(t), k, 0, data)
		require.NoError(t, err)
		_, err = s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CheckNoCheckpointOp(k), location.CreateOp(other, rec("a", 1))})
		conflict := requireConflict(t, err)
		require.Equal(t, []int{1}, conflict.FailedOps)
		requireAbsent(t, s, k)
		requireAbsent(t, s, other)
		require.NoError(t, c.DeleteCheckpoint(ctx(t), k, v))
	}
	_, err := s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CheckNoCheckpointOp(k)})
	require.NoError(t, err)
}

func testNoCheckpointTwice(t *testing.T, h Harness) {
	s, _ := applyCheckpoints(t, h)
	k := location.Key(location.KindInstanceSpot, "twice")
	_, err := s.Apply(ctx(t), []location.Op{location.CheckNoCheckpointOp(k), location.CheckNoCheckpointOp(k)})
	require.ErrorIs(t, err, location.ErrInvalid)
}
