package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
)

// The Relocation Store contract (docs/PROTOCOL.md §3.5), run on the same harness as
// the Location Store suite: the store an Instance holds must also be a
// location.RootStore.
var rootTests = []contractTest{
	{"RootRoundTripsAtEverySize", testRootRoundTrip},
	{"RootRefIsKeySHA256AndSize", testRootRef},
	{"RootOverLimitIsTooLargeAndNothingStored", testRootTooLarge},
	{"RootInvalidKeyRejected", testRootInvalidKey},
	{"RootPutOfIdenticalBytesReturnsSameRef", testRootIdempotent},
	{"RootPutOfOtherBytesIsConflictAndFirstRemains", testRootConflict},
	{"RootPutRaceHasOneContent", testRootRace},
	{"RootGetMissingIsNotFound", testRootGetMissing},
	{"RootDeleteThenGetIsNotFound", testRootDelete},
	{"RootDeleteMissingIsNil", testRootDeleteMissing},
	{"RootGetDuringDeleteIsWholeOrNotFound", testRootGetDuringDelete},
	{"RootKeysAreIndependent", testRootKeysIndependent},
	{"RootBytesAreCopied", testRootCopied},
	{"RootCallsWithEndedContextAreUnavailable", testRootEndedContext},
	{"RootCreatedInApplyLandsWithItsTransaction", testRootInApply},
	{"RootCreateInApplyOverAnExistingRootIsConflict", testRootInApplyConflict},
	{"RootCreateInApplyRollsBackWithItsTransaction", testRootInApplyRollback},
	{"RootCreateInApplyOverInlineLimitIsTooLarge", testRootInApplyTooLarge},
	{"RootDeletedInApplyGoesWithItsTransaction", testRootDeleteInApply},
	{"RootDeleteInApplyRollsBackWithItsTransaction", testRootDeleteInApplyRollback},
}

// applyRoots opens a store that is both a Location Store and a RootStore.
func applyRoots(t *testing.T, h Harness) (location.Store, location.RootStore) {
	t.Helper()
	in := open(t, h)
	r, ok := in.Store.(location.RootStore)
	require.True(t, ok, "%T does not implement location.RootStore", in.Store)
	return in.Store, r
}

// A root written by OpCreateRoot lands with the record of the same
// transaction and reads back as PutRoot's would, empty or not
// (PROTOCOL.md §3.5, §7.5).
func testRootInApply(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	for i, data := range [][]byte{rootBytes(7, 1000), nil, rootBytes(8, location.MaxInlineRootBytes)} {
		k := location.Key(location.KindInstanceSpot, fmt.Sprintf("with-root-%d", i))
		root := fmt.Sprintf("inline-%d", i)
		versions, err := s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CreateRootOp(root, data)})
		require.NoError(t, err)
		require.Len(t, versions, 2)
		require.NotZero(t, versions[0])
		requireRoot(t, r, root, data)
		// Stored identical bytes again by PutRoot: the same reference.
		ref, err := r.PutRoot(ctx(t), root, data)
		require.NoError(t, err)
		require.Equal(t, location.NewRootRef(root, data), ref)
	}
}

// A root already there fails the transaction as a conflict naming the
// root's op, whatever its bytes; nothing of the transaction is applied.
func testRootInApplyConflict(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	first := rootBytes(1, 500)
	_, err := r.PutRoot(ctx(t), "taken", first)
	require.NoError(t, err)
	k := location.Key(location.KindInstanceSpot, "not-written")
	for _, data := range [][]byte{first, rootBytes(2, 500)} {
		_, err = s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CreateRootOp("taken", data)})
		c := requireConflict(t, err)
		require.Equal(t, []int{1}, c.FailedOps)
		requireAbsent(t, s, k)
		requireRoot(t, r, "taken", first)
	}
}

// A transaction that fails on a record stores no root.
func testRootInApplyRollback(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	k := location.Key(location.KindInstanceSpot, "absent")
	_, err := s.Apply(ctx(t), []location.Op{location.UpdateOp(k, 5, rec("a", 1)), location.CreateRootOp("rolled-back", rootBytes(3, 100))})
	c := requireConflict(t, err)
	require.Equal(t, []int{0}, c.FailedOps)
	requireNoRoot(t, r, "rolled-back")
}

// Past MaxInlineRootBytes a root goes through PutRoot: the transaction is
// refused whole.
func testRootInApplyTooLarge(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	k := location.Key(location.KindInstanceSpot, "big")
	_, err := s.Apply(ctx(t), []location.Op{location.CreateOp(k, rec("a", 1)), location.CreateRootOp("big", rootBytes(4, location.MaxInlineRootBytes+1))})
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireAbsent(t, s, k)
	requireNoRoot(t, r, "big")
}

// RootCount is the number of contract tests RunRoots runs.
func RootCount() int { return len(rootTests) }

// RunRoots runs the RootStore contract suite (PROTOCOL.md §3.5) against h,
// whose stores must implement location.RootStore.
func RunRoots(t *testing.T, h Harness) {
	for _, tc := range rootTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, h) })
	}
}

func openRoots(t *testing.T, h Harness) location.RootStore {
	t.Helper()
	_, r := applyRoots(t, h)
	return r
}

// rootBytes returns n bytes that differ from one seed to another and from
// one position to another, so a part out of place changes the hash.
func rootBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func requireRoot(t *testing.T, s location.RootStore, key string, want []byte) {
	t.Helper()
	got, ref, err := s.GetRoot(ctx(t), key)
	require.NoError(t, err, "get root %q", key)
	require.True(t, len(got) == len(want) && string(got) == string(want), "root %q: got %d bytes, want %d (or content differs)", key, len(got), len(want))
	require.Equal(t, location.NewRootRef(key, want), ref)
}

func requireNoRoot(t *testing.T, s location.RootStore, key string) {
	t.Helper()
	got, _, err := s.GetRoot(ctx(t), key)
	require.ErrorIs(t, err, location.ErrNotFound, "root %q must be absent", key)
	require.Nil(t, got)
}

// A root reads back byte for byte at every size up to MaxRootBytes,
// including the empty root and the sizes around a 256 KiB part boundary
// (consulstore's part size, PROTOCOL.md §3.5).
func testRootRoundTrip(t *testing.T, h Harness) {
	s := openRoots(t, h)
	const part = 256 << 10
	sizes := []int{0, 1, 255, part - 1, part, part + 1, 2 * part, 2*part + 1, 4 * part, location.MaxRootBytes - 1, location.MaxRootBytes}
	for i, n := range sizes {
		key := fmt.Sprintf("size-%d", n)
		data := rootBytes(uint64(i+1), n)
		ref, err := s.PutRoot(ctx(t), key, data)
		require.NoError(t, err, "put %d bytes", n)
		require.Equal(t, location.NewRootRef(key, data), ref)
		requireRoot(t, s, key, data)
	}
}

// A RootRef is the key, the SHA-256 of the bytes and their size, from
// PutRoot and from GetRoot alike (PROTOCOL.md §3.5).
func testRootRef(t *testing.T, h Harness) {
	s := openRoots(t, h)
	data := []byte("an activation envelope")
	ref, err := s.PutRoot(ctx(t), "ref", data)
	require.NoError(t, err)
	require.Equal(t, "ref", ref.Key)
	require.Equal(t, sha256.Sum256(data), ref.SHA256)
	require.EqualValues(t, len(data), ref.Size)
	_, got, err := s.GetRoot(ctx(t), "ref")
	require.NoError(t, err)
	require.Equal(t, ref, got)

	ref, err = s.PutRoot(ctx(t), "empty", nil)
	require.NoError(t, err)
	require.Equal(t, location.RootRef{Key: "empty", SHA256: sha256.Sum256(nil), Size: 0}, ref)
	requireRoot(t, s, "empty", []byte{})
}

// A root over MaxRootBytes is ErrTooLarge and nothing is stored
// (PROTOCOL.md §3.5).
func testRootTooLarge(t *testing.T, h Harness) {
	s := openRoots(t, h)
	_, err := s.PutRoot(ctx(t), "big", rootBytes(1, location.MaxRootBytes+1))
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireNoRoot(t, s, "big")
	// The key is still free.
	data := rootBytes(2, 10)
	_, err = s.PutRoot(ctx(t), "big", data)
	require.NoError(t, err)
	requireRoot(t, s, "big", data)
}

// A root key is 1..255 bytes of UTF-8; any other is ErrInvalid on every
// call and nothing is stored (PROTOCOL.md §3.5).
func testRootInvalidKey(t *testing.T, h Harness) {
	s := openRoots(t, h)
	for _, key := range []string{"", strings.Repeat("k", location.MaxIDBytes+1), "bad\xffutf8"} {
		_, err := s.PutRoot(ctx(t), key, []byte("x"))
		require.ErrorIs(t, err, location.ErrInvalid, "put %q", key)
		_, _, err = s.GetRoot(ctx(t), key)
		require.ErrorIs(t, err, location.ErrInvalid, "get %q", key)
		require.ErrorIs(t, s.DeleteRoot(ctx(t), key), location.ErrInvalid, "delete %q", key)
	}
	longest := strings.Repeat("k", location.MaxIDBytes)
	_, err := s.PutRoot(ctx(t), longest, []byte("x"))
	require.NoError(t, err)
	requireRoot(t, s, longest, []byte("x"))
}

// Storing identical bytes again returns the same reference, and the root
// stays as it was (PROTOCOL.md §3.5: a root is written once).
func testRootIdempotent(t *testing.T, h Harness) {
	s := openRoots(t, h)
	for _, n := range []int{0, 100, 300 << 10} {
		key := fmt.Sprintf("twice-%d", n)
		data := rootBytes(uint64(n), n)
		first, err := s.PutRoot(ctx(t), key, data)
		require.NoError(t, err)
		second, err := s.PutRoot(ctx(t), key, append([]byte(nil), data...))
		require.NoError(t, err)
		require.Equal(t, first, second)
		requireRoot(t, s, key, data)
	}
}

// Other bytes under a key that exists are a *ConflictError and the first
// bytes remain (PROTOCOL.md §3.5: a root is never changed).
func testRootConflict(t *testing.T, h Harness) {
	s := openRoots(t, h)
	first := rootBytes(1, 300<<10)
	_, err := s.PutRoot(ctx(t), "once", first)
	require.NoError(t, err)
	sameSize := append([]byte(nil), first...)
	sameSize[len(sameSize)-1] ^= 1
	for _, other := range [][]byte{sameSize, first[:len(first)-1], nil, rootBytes(2, location.MaxRootBytes)} {
		_, err := s.PutRoot(ctx(t), "once", other)
		requireConflict(t, err)
		requireRoot(t, s, "once", first)
	}
}

// Writers racing with different bytes under one key: one content wins, its
// writers get its reference, every other writer a conflict, and the root
// reads back as the winner's bytes, whole (PROTOCOL.md §3.5).
func testRootRace(t *testing.T, h Harness) {
	s := openRoots(t, h)
	const contents, writersEach = 3, 2
	datas := make([][]byte, contents)
	for i := range datas {
		datas[i] = rootBytes(uint64(i+1), 300<<10+i) // two parts each
	}
	type result struct {
		content int
		ref     location.RootRef
		err     error
	}
	results := make(chan result, contents*writersEach)
	var wg sync.WaitGroup
	start := make(chan struct{})
	c := ctx(t)
	for i := 0; i < contents; i++ {
		for w := 0; w < writersEach; w++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				ref, err := s.PutRoot(c, "raced", datas[i])
				results <- result{i, ref, err}
			}(i)
		}
	}
	close(start)
	wg.Wait()
	close(results)
	winner := -1
	for r := range results {
		if r.err != nil {
			var c *location.ConflictError
			require.True(t, errors.As(r.err, &c), "content %d: %v", r.content, r.err)
			continue
		}
		require.True(t, winner == -1 || winner == r.content, "contents %d and %d both won", winner, r.content)
		winner = r.content
		require.Equal(t, location.NewRootRef("raced", datas[r.content]), r.ref)
	}
	require.NotEqual(t, -1, winner, "no writer won")
	requireRoot(t, s, "raced", datas[winner])
}

// A root never stored is ErrNotFound (PROTOCOL.md §3.5).
func testRootGetMissing(t *testing.T, h Harness) {
	s := openRoots(t, h)
	requireNoRoot(t, s, "never")
}

// A deleted root is ErrNotFound, and its key can then hold other bytes
// (PROTOCOL.md §3.5).
func testRootDelete(t *testing.T, h Harness) {
	s := openRoots(t, h)
	for _, n := range []int{0, 10, location.MaxRootBytes} {
		key := fmt.Sprintf("gone-%d", n)
		_, err := s.PutRoot(ctx(t), key, rootBytes(1, n))
		require.NoError(t, err)
		require.NoError(t, s.DeleteRoot(ctx(t), key))
		requireNoRoot(t, s, key)
		again := rootBytes(2, n/2+1)
		_, err = s.PutRoot(ctx(t), key, again)
		require.NoError(t, err)
		requireRoot(t, s, key, again)
	}
}

// Deleting a root that does not exist, or no longer does, is not an error
// (PROTOCOL.md §3.5).
func testRootDeleteMissing(t *testing.T, h Harness) {
	s := openRoots(t, h)
	require.NoError(t, s.DeleteRoot(ctx(t), "never"))
	_, err := s.PutRoot(ctx(t), "once", []byte("x"))
	require.NoError(t, err)
	require.NoError(t, s.DeleteRoot(ctx(t), "once"))
	require.NoError(t, s.DeleteRoot(ctx(t), "once"))
	requireNoRoot(t, s, "once")
}

// A GetRoot racing with a DeleteRoot returns the whole root or
// ErrNotFound, never part of it and never a corruption error
// (PROTOCOL.md §3.5: a root is readable only whole).
func testRootGetDuringDelete(t *testing.T, h Harness) {
	s := openRoots(t, h)
	data := rootBytes(7, 600<<10) // three parts in consulstore
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("racing-%d", i)
		_, err := s.PutRoot(ctx(t), key, data)
		require.NoError(t, err)
		type result struct {
			data []byte
			err  error
		}
		got := make(chan result, 2)
		c := ctx(t)
		for r := 0; r < 2; r++ {
			go func() {
				b, _, err := s.GetRoot(c, key)
				got <- result{b, err}
			}()
		}
		require.NoError(t, s.DeleteRoot(c, key))
		for r := 0; r < 2; r++ {
			res := <-got
			if res.err != nil {
				require.ErrorIs(t, res.err, location.ErrNotFound)
				require.Nil(t, res.data)
				continue
			}
			require.True(t, string(res.data) == string(data), "a racing GetRoot returned %d bytes that are not the root", len(res.data))
		}
		requireNoRoot(t, s, key)
	}
}

// Roots under different keys are apart: keys that are prefixes of one
// another, or hold '/', '.', '%' or non-ASCII, neither read nor delete each
// other (PROTOCOL.md §3.5).
func testRootKeysIndependent(t *testing.T, h Harness) {
	s := openRoots(t, h)
	keys := []string{"a", "ab", "a/b", "a/part", "a%2F", "..", ".", "a b", "é", "🚀/root"}
	for i, k := range keys {
		_, err := s.PutRoot(ctx(t), k, rootBytes(uint64(i+1), 300<<10+i))
		require.NoError(t, err, "put %q", k)
	}
	for i, k := range keys {
		requireRoot(t, s, k, rootBytes(uint64(i+1), 300<<10+i))
	}
	require.NoError(t, s.DeleteRoot(ctx(t), "a"))
	requireNoRoot(t, s, "a")
	for i, k := range keys[1:] {
		requireRoot(t, s, k, rootBytes(uint64(i+2), 300<<10+i+1))
	}
}

// The store keeps its own copy of a root and hands out copies: changing the
// bytes given to PutRoot or returned by GetRoot changes no root
// (PROTOCOL.md §3.5: a root is immutable).
func testRootCopied(t *testing.T, h Harness) {
	s := openRoots(t, h)
	data := []byte("original")
	_, err := s.PutRoot(ctx(t), "copy", data)
	require.NoError(t, err)
	data[0] = 'X'
	got, _, err := s.GetRoot(ctx(t), "copy")
	require.NoError(t, err)
	require.Equal(t, []byte("original"), got)
	got[0] = 'Y'
	requireRoot(t, s, "copy", []byte("original"))
}

// A call whose context has ended is ErrUnavailable and applies nothing, as
// for every other store call (retrying is safe; docs/CONSUL.md lists the
// Location Store's error classes).
func testRootEndedContext(t *testing.T, h Harness) {
	s := openRoots(t, h)
	_, err := s.PutRoot(ctx(t), "kept", []byte("x"))
	require.NoError(t, err)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.PutRoot(ended, "new", rootBytes(1, 300<<10))
	require.ErrorIs(t, err, location.ErrUnavailable)
	requireNoRoot(t, s, "new")
	_, _, err = s.GetRoot(ended, "kept")
	require.ErrorIs(t, err, location.ErrUnavailable)
	require.ErrorIs(t, s.DeleteRoot(ended, "kept"), location.ErrUnavailable)
	requireRoot(t, s, "kept", []byte("x"))
}

// A root deleted in a transaction goes with it, at any size (a root of
// several parts included); an absent root is no failure.
func testRootDeleteInApply(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	k := location.Key(location.KindInstanceSpot, "pointing")
	v, err := s.CompareAndSet(ctx(t), k, 0, rec("a", 1))
	require.NoError(t, err)
	for i, n := range []int{100, 3*location.MaxInlineRootBytes + 7} {
		key := fmt.Sprintf("pointed-%d", i)
		_, err := r.PutRoot(ctx(t), key, rootBytes(uint64(i+7), n))
		require.NoError(t, err)
		vs, err := s.Apply(ctx(t), []location.Op{location.UpdateOp(k, v, rec("a", 1)), location.DeleteRootOp(key)})
		require.NoError(t, err)
		v = vs[0]
		requireNoRoot(t, r, key)
		// What it deleted is gone whole: the same key takes other bytes.
		_, err = r.PutRoot(ctx(t), key, rootBytes(99, 10))
		require.NoError(t, err)
	}
	_, err = s.Apply(ctx(t), []location.Op{location.UpdateOp(k, v, rec("a", 1)), location.DeleteRootOp("never-stored")})
	require.NoError(t, err)
}

// A transaction that fails deletes no root.
func testRootDeleteInApplyRollback(t *testing.T, h Harness) {
	s, r := applyRoots(t, h)
	data := rootBytes(4, 300)
	_, err := r.PutRoot(ctx(t), "kept", data)
	require.NoError(t, err)
	k := location.Key(location.KindInstanceSpot, "absent")
	_, err = s.Apply(ctx(t), []location.Op{location.UpdateOp(k, 5, rec("a", 1)), location.DeleteRootOp("kept")})
	c := requireConflict(t, err)
	require.Equal(t, []int{0}, c.FailedOps)
	requireRoot(t, r, "kept", data)
}
