// Package storetest is the Location Store contract suite: every Store
// implementation runs Run (and the benchmarks) against itself, so memstore
// and consulstore are held to exactly the same rules (docs/PROTOCOL.md §3).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Instance is one store under test over an empty namespace.
type Instance struct {
	Store location.Store
	// Pass lets d of lease time go by: a manual clock advances, a real
	// store's wall clock is waited on.
	Pass func(d time.Duration)
}

// Harness makes fresh instances of one implementation.
type Harness struct {
	// New returns a store over an empty namespace; the suite closes it.
	New func(t testing.TB) Instance
	// LeaseTTL is the owner lease TTL the lease tests use.
	LeaseTTL time.Duration
	// Expiry is how long after its last renewal a lease may still be in
	// force (Consul: up to 2×TTL); the suite waits at most this long, in
	// polls, for an ended lease to be noticed.
	Expiry time.Duration
}

// Contract test names, so callers can count them.
var testNames []string

type contractTest struct {
	name string
	run  func(t *testing.T, h Harness)
}

var tests = []contractTest{
	{"CreateOnlyWhenAbsent", testCreateOnlyWhenAbsent},
	{"CompareAndSetWinAndLose", testCASWinAndLose},
	{"CompareAndSetRaceHasOneWinner", testCASRace},
	{"EveryAcceptedWriteIsANewVersion", testIdenticalRewrite},
	{"ReadMissingIsNotFound", testReadMissing},
	{"ReadKeysAnswersAsReadDoes", testReadKeys},
	{"ApplyIsAllOrNothing", testApplyAllOrNothing},
	{"ApplyOf128Operations", testApply128},
	{"ApplyRejectsMalformedTransactions", testApplyInvalid},
	{"ValueOverLimitIsTooLargeAndNothingWritten", testTooLarge},
	{"ListPagingBounds", testListPaging},
	{"ListPageBytesBound", testListPageBytes},
	{"OddSpotIDsRoundTrip", testOddIDs},
	{"InvalidIDsRejected", testInvalidIDs},
	{"WatchSeesChangeAndDelete", testWatch},
	{"ClaimNodeCreatesDescriptorAndEntryClaim", testClaimNode},
	{"NodeNameUniqueAmongLiveNodes", testNodeNameUnique},
	{"EntryClaimConflictLeavesNothingBehind", testEntryClaimConflict},
	{"RenewKeepsLease", testRenewKeepsLease},
	{"RenewIsAHeartbeat", testRenewIsAHeartbeat},
	{"RevokeLease", testRevokeLease},
	{"LeaseExpiryFreesNodeClaim", testLeaseExpiry},
	{"StaleReleaseLeavesReplacementAlone", testStaleRelease},
	{"ReleaseNodeDeletesClaimAndEndsLease", testReleaseNode},
	{"LeaseCheckAdmitsOnlyTheLiveHolder", testLeaseCheck},
	{"LeaseCheckFailsOnceTheLeaseExpired", testLeaseCheckAfterExpiry},
	{"UpdateNodeChangesStatusAndCapacity", testUpdateNode},
	{"UpdateNodeRefusesAChangeOfAFixedField", testUpdateNodeFixedFields},
	{"UpdateNodeUnderAnotherLeaseConflicts", testUpdateNodeOtherLease},
	{"UpdateNodeFailsOnceTheLeaseEnded", testUpdateNodeAfterLeaseEnd},
	{"UpdatedNodeStillEndsWithItsLease", testUpdatedNodeEndsWithLease},
	{"UpdatedNodeIsReleased", testUpdatedNodeReleased},
	{"NoteCreateOnlyWhenAbsentThenByVersion", testNoteWrite},
	{"NoteRewriteOfSameBytesIsANewVersion", testNoteRewrite},
	{"NoteValuesRoundTripByteExactly", testNoteValues},
	{"NoteDeleteByVersionOrAny", testNoteDelete},
	{"NoteWatchSeesWriteAndDelete", testNoteWatch},
	{"NoteListOrderedByMeshNodeName", testNoteList},
	{"NoteInvalidKeysRejected", testNoteInvalidKeys},
	{"NoteOverLimitIsTooLargeAndNothingWritten", testNoteTooLarge},
	{"SweepNotesKeepsOnlyLiveLifecycles", testSweepNotes},
	{"SlotTakeSetFreeAndList", testSlotTakeSetFree},
	{"SlotTakeOfAHeldSlotConflictsAndWritesNothing", testSlotTakeHeld},
	{"SlotWriteUnderAnotherLeaseIsLeaseEnded", testSlotLeaseEnded},
	{"SlotsEndWithTheirLease", testSlotsEndWithLease},
	{"SlotTakeRaceHasOneWinner", testSlotRace},
	{"SlotOpsValidatedAndCounted", testSlotOpsInvalid},
}

func init() {
	for _, tc := range tests {
		testNames = append(testNames, tc.name)
	}
}

// Count is the number of contract tests Run runs.
func Count() int { return len(testNames) }

// waitsOnLeaseTime are the contract tests that spend their time letting
// lease time pass: on a real store (Consul) a test sleeps a TTL and more,
// so they run side by side, after the others. Each has an instance of its
// own; they stay apart from the watch tests, which look for their watch's
// goroutine among all of the process's.
var waitsOnLeaseTime = map[string]bool{
	"RenewKeepsLease":                    true,
	"LeaseExpiryFreesNodeClaim":          true,
	"StaleReleaseLeavesReplacementAlone": true,
	"LeaseCheckFailsOnceTheLeaseExpired": true,
	"UpdateNodeFailsOnceTheLeaseEnded":   true,
	"UpdatedNodeStillEndsWithItsLease":   true,
	"SlotsEndWithTheirLease":             true,
}

// Run runs the whole contract suite against h.
func Run(t *testing.T, h Harness) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if waitsOnLeaseTime[tc.name] {
				t.Parallel()
			}
			tc.run(t, h)
		})
	}
}

func open(t *testing.T, h Harness) Instance {
	t.Helper()
	in := h.New(t)
	t.Cleanup(func() { _ = in.Store.Close() })
	return in
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func rec(typ string, gen uint64) *location.Record {
	return &location.Record{
		ObjectGeneration:         gen,
		AuthorityOwnerGeneration: gen,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_READY,
		StableType:               typ,
		SpotKind:                 messages.SpotKind_SPOT_KIND_INSTANCE,
		Owner:                    &messages.Owner{Mesh: "m", NodeRid: "n1", NodeGeneration: 1},
	}
}

func requireConflict(t *testing.T, err error) *location.ConflictError {
	t.Helper()
	require.ErrorIs(t, err, location.ErrConflict)
	var c *location.ConflictError
	require.True(t, errors.As(err, &c), "conflict must be a *ConflictError: %v", err)
	return c
}

func requireAbsent(t *testing.T, s location.Store, key location.AuthorityKey) {
	t.Helper()
	_, err := s.Read(ctx(t), key)
	require.ErrorIs(t, err, location.ErrNotFound, "%s must be absent", key)
}

// eventually polls cond until it holds or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %s", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A create succeeds only while the key is absent; a second create is a
// conflict carrying the record that won.
// Reference: PROTOCOL.md §3.2 (every mutation is a CAS; Missing = no key).
func testCreateOnlyWhenAbsent(t *testing.T, h Harness) {
	s := open(t, h).Store
	key := location.Key(location.KindInstanceSpot, "create-only")
	v1, err := s.CompareAndSet(ctx(t), key, 0, rec("room", 1))
	require.NoError(t, err)
	require.NotZero(t, v1)

	_, err = s.CompareAndSet(ctx(t), key, 0, rec("other", 9))
	c := requireConflict(t, err)
	cur, ok := c.CurrentOf(key)
	require.True(t, ok)
	require.Equal(t, v1, cur.Version)
	require.Equal(t, "room", cur.Record.GetStableType())

	got, err := s.Read(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, v1, got.Version)
	require.Equal(t, "room", got.Record.GetStableType())
}

// A CAS naming the current version wins and moves the version; one naming
// an older version loses, writes nothing and reports the current record.
// Reference: PROTOCOL.md §3.2, §3.6 (?cas=N).
func testCASWinAndLose(t *testing.T, h Harness) {
	s := open(t, h).Store
	key := location.Key(location.KindActor, "cas")
	v1, err := s.CompareAndSet(ctx(t), key, 0, rec("a", 1))
	require.NoError(t, err)
	v2, err := s.CompareAndSet(ctx(t), key, v1, rec("a", 2))
	require.NoError(t, err)
	require.Greater(t, v2, v1)

	_, err = s.CompareAndSet(ctx(t), key, v1, rec("a", 3))
	c := requireConflict(t, err)
	cur, ok := c.CurrentOf(key)
	require.True(t, ok)
	require.Equal(t, v2, cur.Version)
	require.EqualValues(t, 2, cur.Record.GetObjectGeneration())

	got, err := s.Read(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, v2, got.Version)
	require.EqualValues(t, 2, got.Record.GetObjectGeneration())
}

// 16 writers racing a CAS on one version: exactly one wins and the record
// is the winner's. Reference: PROTOCOL.md §3.2, §5.11 (the target's CAS).
func testCASRace(t *testing.T, h Harness) {
	s := open(t, h).Store
	key := location.Key(location.KindInstanceSpot, "race")
	v1, err := s.CompareAndSet(ctx(t), key, 0, rec("r", 1))
	require.NoError(t, err)

	const writers = 16
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		winners   []int
		conflicts int
		others    []error
	)
	start := make(chan struct{})
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			r := rec("r", 2)
			r.Owner.NodeRid = fmt.Sprintf("writer-%d", i)
			_, err := s.CompareAndSet(context.Background(), key, v1, r)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				winners = append(winners, i)
			case errors.Is(err, location.ErrConflict):
				conflicts++
			default:
				others = append(others, err)
			}
		}(i)
	}
	close(start)
	wg.Wait()
	require.Empty(t, others)
	require.Len(t, winners, 1)
	require.Equal(t, writers-1, conflicts)
	got, err := s.Read(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("writer-%d", winners[0]), got.Record.GetOwner().GetNodeRid())
}

// Writing a record identical to the stored one is still a new version, so a
// CAS on the old version afterwards loses. Reference: PROTOCOL.md §3.6 (Consul
// keeps ModifyIndex for an identical value).
func testIdenticalRewrite(t *testing.T, h Harness) {
	s := open(t, h).Store
	key := location.Key(location.KindUserSpot, "same")
	v1, err := s.CompareAndSet(ctx(t), key, 0, rec("u", 1))
	require.NoError(t, err)
	v2, err := s.CompareAndSet(ctx(t), key, v1, rec("u", 1))
	require.NoError(t, err)
	require.NotEqual(t, v1, v2)
	_, err = s.CompareAndSet(ctx(t), key, v1, rec("u", 1))
	requireConflict(t, err)
}

// Reading a key that was never written, or a node never claimed, is
// NotFound; renewing an unknown lease is NotFound.
// Reference: PROTOCOL.md §3.1 (Missing is the absence of the key).
func testReadMissing(t *testing.T, h Harness) {
	s := open(t, h).Store
	requireAbsent(t, s, location.Key(location.KindEntry, "nobody"))
	_, err := s.ReadNode(ctx(t), location.NodeKey{Mesh: "m", NodeRid: "none"})
	require.ErrorIs(t, err, location.ErrNotFound)
	alive, err := s.LeaseAlive(ctx(t), "00000000-0000-0000-0000-000000000000")
	require.NoError(t, err)
	require.False(t, alive)
	err = s.RenewLease(ctx(t), "00000000-0000-0000-0000-000000000000")
	require.ErrorIs(t, err, location.ErrNotFound)
}

// A transaction applies all of its operations or none; a failed one names
// the failing operation and carries the current records.
// Reference: PROTOCOL.md §3.2 (a multi-key change is one transaction).
func testApplyAllOrNothing(t *testing.T, h Harness) {
	s := open(t, h).Store
	a := location.Key(location.KindActor, "txn-a")
	b := location.Key(location.KindUserSpot, "txn-b")
	c := location.Key(location.KindInstanceSpot, "txn-c")
	vb, err := s.CompareAndSet(ctx(t), b, 0, rec("b", 1))
	require.NoError(t, err)
	vc, err := s.CompareAndSet(ctx(t), c, 0, rec("c", 1))
	require.NoError(t, err)

	// b is named at a stale version: nothing of the three may happen.
	_, err = s.Apply(ctx(t), []location.Op{
		location.CreateOp(a, rec("a", 1)),
		location.UpdateOp(b, vb+1000, rec("b", 2)),
		location.DeleteOp(c, vc),
	})
	conflict := requireConflict(t, err)
	require.Contains(t, conflict.FailedOps, 1)
	cur, ok := conflict.CurrentOf(b)
	require.True(t, ok)
	require.Equal(t, vb, cur.Version)
	requireAbsent(t, s, a)
	gotB, err := s.Read(ctx(t), b)
	require.NoError(t, err)
	require.Equal(t, vb, gotB.Version)
	gotC, err := s.Read(ctx(t), c)
	require.NoError(t, err)
	require.Equal(t, vc, gotC.Version)

	// A failed check op alone also aborts the writes beside it.
	_, err = s.Apply(ctx(t), []location.Op{
		location.CreateOp(a, rec("a", 1)),
		location.CheckOp(c, 0),
	})
	requireConflict(t, err)
	requireAbsent(t, s, a)

	// With every precondition right, all of it happens at once.
	versions, err := s.Apply(ctx(t), []location.Op{
		location.CreateOp(a, rec("a", 1)),
		location.UpdateOp(b, vb, rec("b", 2)),
		location.DeleteOp(c, vc),
		location.CheckOp(location.Key(location.KindEntry, "never"), 0),
	})
	require.NoError(t, err)
	require.Len(t, versions, 4)
	gotA, err := s.Read(ctx(t), a)
	require.NoError(t, err)
	require.Equal(t, versions[0], gotA.Version)
	gotB, err = s.Read(ctx(t), b)
	require.NoError(t, err)
	require.Equal(t, versions[1], gotB.Version)
	require.EqualValues(t, 2, gotB.Record.GetObjectGeneration())
	requireAbsent(t, s, c)
	require.Zero(t, versions[2])
}

// One transaction may hold 128 operations; 129 are refused before anything
// is written. Reference: PROTOCOL.md §3.6 (at most 128 operations).
func testApply128(t *testing.T, h Harness) {
	s := open(t, h).Store
	ops := make([]location.Op, location.MaxApplyOps)
	for i := range ops {
		ops[i] = location.CreateOp(location.Key(location.KindActor, fmt.Sprintf("bulk-%03d", i)), rec("bulk", 1))
	}
	versions, err := s.Apply(ctx(t), ops)
	require.NoError(t, err)
	for i, v := range versions {
		require.NotZero(t, v, "op %d", i)
	}
	page, err := s.List(ctx(t), location.KindActor, location.PageRequest{Size: location.MaxPageSize})
	require.NoError(t, err)
	require.Len(t, page.Items, location.MaxApplyOps)

	tooMany := make([]location.Op, location.MaxApplyOps+1)
	for i := range tooMany {
		tooMany[i] = location.CreateOp(location.Key(location.KindUserSpot, fmt.Sprintf("over-%03d", i)), rec("bulk", 1))
	}
	_, err = s.Apply(ctx(t), tooMany)
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireAbsent(t, s, tooMany[0].Key)
}

// Malformed transactions are refused whole: empty, a key twice, an update
// or delete without a version, a nil record.
// Reference: PROTOCOL.md §3.6, §10 (bad input gets a typed error and changes nothing).
func testApplyInvalid(t *testing.T, h Harness) {
	s := open(t, h).Store
	k := location.Key(location.KindActor, "dup")
	for name, ops := range map[string][]location.Op{
		"empty":          nil,
		"key twice":      {location.CreateOp(k, rec("x", 1)), location.CheckOp(k, 0)},
		"update at 0":    {location.UpdateOp(k, 0, rec("x", 1))},
		"delete at 0":    {location.DeleteOp(k, 0)},
		"nil record":     {location.CreateOp(k, nil)},
		"unknown op":     {{Kind: 99, Key: k}},
		"unknown kind":   {location.CreateOp(location.Key(99, "x"), rec("x", 1))},
		"invalid key id": {location.CreateOp(location.Key(location.KindActor, ""), rec("x", 1))},
	} {
		_, err := s.Apply(ctx(t), ops)
		require.ErrorIs(t, err, location.ErrInvalid, name)
	}
	requireAbsent(t, s, k)
}

// A record over MaxRecordBytes, or a transaction over MaxApplyBytes, is
// TooLarge and writes nothing. Reference: PROTOCOL.md §3.6 (a record at most
// 256 KiB, an Apply at most 256 KiB; Consul takes values and transactions ≤ 512 KiB).
func testTooLarge(t *testing.T, h Harness) {
	s := open(t, h).Store
	big := rec("big", 1)
	big.CreationIntent = &messages.CreationIntent{ContentRef: strings.Repeat("x", location.MaxRecordBytes)}
	key := location.Key(location.KindUserSpot, "too-large")
	_, err := s.CompareAndSet(ctx(t), key, 0, big)
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireAbsent(t, s, key)

	// Each record fits; together they do not.
	half := rec("half", 1)
	half.CreationIntent = &messages.CreationIntent{ContentRef: strings.Repeat("y", location.MaxRecordBytes/2)}
	k1, k2 := location.Key(location.KindUserSpot, "half-1"), location.Key(location.KindUserSpot, "half-2")
	_, err = s.Apply(ctx(t), []location.Op{location.CreateOp(k1, half), location.CreateOp(k2, half)})
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireAbsent(t, s, k1)
	requireAbsent(t, s, k2)

	// The largest allowed record is stored and read back whole.
	max := rec("max", 1)
	max.CreationIntent = &messages.CreationIntent{ContentRef: strings.Repeat("z", location.MaxRecordBytes-400)}
	require.LessOrEqual(t, location.EncodedSize(max), location.MaxRecordBytes)
	_, err = s.CompareAndSet(ctx(t), k1, 0, max)
	require.NoError(t, err)
	got, err := s.Read(ctx(t), k1)
	require.NoError(t, err)
	require.Equal(t, max.CreationIntent.ContentRef, got.Record.GetCreationIntent().GetContentRef())
}

// Page sizes outside 1..1000 are rejected; paging visits every record of
// the kind exactly once and no record of another kind.
// Reference: PROTOCOL.md §3.2, §3.6 (List by kind, pages of 1..1000).
func testListPaging(t *testing.T, h Harness) {
	s := open(t, h).Store
	for _, size := range []int{-1, 0, location.MaxPageSize + 1} {
		_, err := s.List(ctx(t), location.KindUserSpot, location.PageRequest{Size: size})
		require.ErrorIs(t, err, location.ErrInvalid, "size %d", size)
	}
	_, err := s.List(ctx(t), location.Kind(99), location.PageRequest{Size: 10})
	require.ErrorIs(t, err, location.ErrInvalid)

	want := map[string]bool{}
	var ops []location.Op
	for i := 0; i < 25; i++ {
		id := fmt.Sprintf("spot-%02d", i)
		want[id] = true
		ops = append(ops, location.CreateOp(location.Key(location.KindUserSpot, id), rec("u", 1)))
	}
	ops = append(ops, location.CreateOp(location.Key(location.KindInstanceSpot, "other-kind"), rec("i", 1)))
	_, err = s.Apply(ctx(t), ops)
	require.NoError(t, err)

	seen := map[string]int{}
	req := location.PageRequest{Size: 7}
	pages := 0
	for {
		page, err := s.List(ctx(t), location.KindUserSpot, req)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Items), 7)
		pages++
		for _, it := range page.Items {
			require.Equal(t, location.KindUserSpot, it.Key.Kind)
			require.NotZero(t, it.Version)
			seen[it.Key.ID]++
		}
		if page.Next == "" {
			break
		}
		require.Less(t, pages, 10, "paging must end")
		req.After = page.Next
	}
	require.Equal(t, 4, pages)
	require.Len(t, seen, len(want))
	for id, n := range seen {
		require.True(t, want[id], id)
		require.Equal(t, 1, n, id)
	}

	one, err := s.List(ctx(t), location.KindUserSpot, location.PageRequest{Size: location.MaxPageSize})
	require.NoError(t, err)
	require.Len(t, one.Items, 25)
	require.Empty(t, one.Next)

	none, err := s.List(ctx(t), location.KindEntry, location.PageRequest{Size: 1})
	require.NoError(t, err)
	require.Empty(t, none.Items)
	require.Empty(t, none.Next)
}

// A page stops before its encoded records pass 4 MiB, and the rest follow
// on the next pages. Reference: PROTOCOL.md §3.6 (a page ≤ 4 MiB encoded).
func testListPageBytes(t *testing.T, h Harness) {
	s := open(t, h).Store
	const n = 20
	for i := 0; i < n; i++ {
		r := rec("wide", 1)
		r.CreationIntent = &messages.CreationIntent{ContentRef: strings.Repeat("w", location.MaxRecordBytes-400)}
		_, err := s.CompareAndSet(ctx(t), location.Key(location.KindActor, fmt.Sprintf("wide-%02d", i)), 0, r)
		require.NoError(t, err)
	}
	req := location.PageRequest{Size: location.MaxPageSize}
	total := 0
	for {
		page, err := s.List(ctx(t), location.KindActor, req)
		require.NoError(t, err)
		bytes := 0
		for _, it := range page.Items {
			bytes += location.EncodedSize(it.Record)
		}
		require.LessOrEqual(t, bytes, location.MaxPageBytes)
		require.NotEmpty(t, page.Items)
		total += len(page.Items)
		if page.Next == "" {
			break
		}
		require.Less(t, len(page.Items), n, "a full first page would pass 4 MiB")
		req.After = page.Next
	}
	require.Equal(t, n, total)
}

// OddIDs are valid Spot IDs that a key layout could mangle.
var OddIDs = []string{
	"a/b", "/leading", "trailing/", "a//b", "100%", "%2F", "%", "with space", " ",
	"emoji 🚀🌍", "ü", ".", "..", "../..", "?q=1&x#frag", "back\\slash", "tab\there",
	"new\nline", "nul\x00byte", "Case", "case", strings.Repeat("é", 127), strings.Repeat("z", 255),
}

// Any valid Spot ID — UTF-8, 1..255 bytes, with '/', '%', spaces and emoji
// — is stored, read, listed and claimed byte-exactly, case-sensitively.
// Reference: PROTOCOL.md §7.1.
func testOddIDs(t *testing.T, h Harness) {
	s := open(t, h).Store
	want := map[string]location.StoreVersion{}
	for i, id := range OddIDs {
		require.NoError(t, location.ValidateID("id", id), "%q", id)
		r := rec(fmt.Sprintf("type-%d", i), uint64(i+1))
		v, err := s.CompareAndSet(ctx(t), location.Key(location.KindInstanceSpot, id), 0, r)
		require.NoError(t, err, "%q", id)
		want[id] = v
	}
	for i, id := range OddIDs {
		got, err := s.Read(ctx(t), location.Key(location.KindInstanceSpot, id))
		require.NoError(t, err, "%q", id)
		require.Equal(t, id, got.Key.ID)
		require.Equal(t, fmt.Sprintf("type-%d", i), got.Record.GetStableType(), "%q", id)
		require.Equal(t, want[id], got.Version)
	}
	page, err := s.List(ctx(t), location.KindInstanceSpot, location.PageRequest{Size: location.MaxPageSize})
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, it := range page.Items {
		listed[it.Key.ID] = true
	}
	require.Len(t, listed, len(OddIDs))
	for _, id := range OddIDs {
		require.True(t, listed[id], "%q not listed", id)
	}

	// A node whose mesh, RID and Entry Spot ID are odd claims and releases.
	node := &location.NodeDescriptor{Mesh: "mesh/🚀", NodeRid: "rid 100%", NodeGeneration: 1, EntrySpotId: "entry/ü ..", Address: "127.0.0.1:1"}
	lease, err := s.ClaimNode(ctx(t), node, h.LeaseTTL)
	require.NoError(t, err)
	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(node))
	require.NoError(t, err)
	require.Equal(t, node.GetEntrySpotId(), got.Node.GetEntrySpotId())
	require.Equal(t, string(lease.ID), got.Node.GetLeaseId())
	nodes, err := s.ListNodes(ctx(t), "mesh/🚀")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	entry, err := s.Read(ctx(t), location.Key(location.KindEntry, "entry/ü .."))
	require.NoError(t, err)
	require.Equal(t, "rid 100%", entry.Record.GetOwner().GetNodeRid())
}

// Empty, 256-byte and invalid UTF-8 IDs are refused before any write.
// Reference: PROTOCOL.md §7.1, §3.6 (refused before any store write).
func testInvalidIDs(t *testing.T, h Harness) {
	s := open(t, h).Store
	for _, id := range []string{"", strings.Repeat("z", 256), "bad\xffutf8", "\xc3"} {
		key := location.Key(location.KindUserSpot, id)
		_, err := s.CompareAndSet(ctx(t), key, 0, rec("x", 1))
		require.ErrorIs(t, err, location.ErrInvalid, "%q", id)
		_, err = s.Read(ctx(t), key)
		require.ErrorIs(t, err, location.ErrInvalid, "%q", id)
	}
	_, err := s.ClaimNode(ctx(t), &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "bad\xff"}, h.LeaseTTL)
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = s.ClaimNode(ctx(t), &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "e"}, 0)
	require.ErrorIs(t, err, location.ErrInvalid)
	page, err := s.List(ctx(t), location.KindUserSpot, location.PageRequest{Size: 10})
	require.NoError(t, err)
	require.Empty(t, page.Items)
}

// Watch returns once the key leaves the version it was given: created,
// updated or deleted. Reference: PROTOCOL.md §3.2 (Watch).
func testWatch(t *testing.T, h Harness) {
	s := open(t, h).Store
	key := location.Key(location.KindInstanceSpot, "watched")

	type result struct {
		v   location.Versioned
		err error
	}
	watch := func(after location.StoreVersion) <-chan result {
		ch := make(chan result, 1)
		go func() {
			v, err := s.Watch(ctx(t), key, after)
			ch <- result{v, err}
		}()
		return ch
	}

	created := watch(0)
	v1, err := s.CompareAndSet(ctx(t), key, 0, rec("w", 1))
	require.NoError(t, err)
	r := <-created
	require.NoError(t, r.err)
	require.Equal(t, v1, r.v.Version)

	updated := watch(v1)
	v2, err := s.CompareAndSet(ctx(t), key, v1, rec("w", 2))
	require.NoError(t, err)
	r = <-updated
	require.NoError(t, r.err)
	require.Equal(t, v2, r.v.Version)
	require.EqualValues(t, 2, r.v.Record.GetObjectGeneration())

	deleted := watch(v2)
	_, err = s.Apply(ctx(t), []location.Op{location.DeleteOp(key, v2)})
	require.NoError(t, err)
	r = <-deleted
	require.NoError(t, r.err)
	require.False(t, r.v.Present())

	// A watch on a stale version returns at once with the current state.
	v3, err := s.CompareAndSet(ctx(t), key, 0, rec("w", 3))
	require.NoError(t, err)
	r = <-watch(v1)
	require.NoError(t, r.err)
	require.Equal(t, v3, r.v.Version)

	// A watch ends with the caller's context.
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.Watch(c, key, v3); done <- err }()
	cancel()
	require.Error(t, <-done)
}

func node(rid, entry string, gen uint64) *location.NodeDescriptor {
	return &location.NodeDescriptor{
		Mesh: "mesh", NodeRid: rid, NodeGeneration: gen, EntrySpotId: entry,
		Address: "127.0.0.1:7000", StableTypes: []string{"room"}, Capacity: 100, Weight: 1,
		Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1,
	}
}

// A claim creates the descriptor and a Ready Entry claim owned by the node,
// both under the new lease. Reference: PROTOCOL.md §3.4 (the node claim).
func testClaimNode(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-1", "roam-entry-1", 7)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	require.NotEmpty(t, lease.ID)
	require.Equal(t, h.LeaseTTL, lease.TTL)

	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	require.Equal(t, string(lease.ID), got.Node.GetLeaseId())
	require.Equal(t, n.GetAddress(), got.Node.GetAddress())
	require.Equal(t, []string{"room"}, got.Node.GetStableTypes())
	require.EqualValues(t, 7, got.Node.GetNodeGeneration())

	entry, err := s.Read(ctx(t), location.Key(location.KindEntry, "roam-entry-1"))
	require.NoError(t, err)
	require.Equal(t, messages.LifecycleState_LIFECYCLE_STATE_READY, entry.Record.GetState())
	require.Equal(t, messages.SpotKind_SPOT_KIND_ENTRY, entry.Record.GetSpotKind())
	require.Equal(t, "rid-1", entry.Record.GetOwner().GetNodeRid())
	require.Equal(t, string(lease.ID), entry.Record.GetOwner().GetLeaseId())

	alive, err := s.LeaseAlive(ctx(t), lease.ID)
	require.NoError(t, err)
	require.True(t, alive)

	all, err := s.ListNodes(ctx(t), "")
	require.NoError(t, err)
	require.Len(t, all, 1)
	other, err := s.ListNodes(ctx(t), "other-mesh")
	require.NoError(t, err)
	require.Empty(t, other)
}

// A node name is held by one live node of a mesh at a time: a second
// claim of it writes nothing and fails ErrNodeNameTaken (a conflict);
// another mesh may use it; released, it can be claimed again.
func testNodeNameUnique(t *testing.T, h Harness) {
	s := open(t, h).Store
	first := node("rid-n1", "roam-entry-n1", 1)
	first.Name = "node-a"
	_, err := s.ClaimNode(ctx(t), first, h.LeaseTTL)
	require.NoError(t, err)

	second := node("rid-n2", "roam-entry-n2", 1)
	second.Name = "node-a"
	_, err = s.ClaimNode(ctx(t), second, h.LeaseTTL)
	require.ErrorIs(t, err, location.ErrNodeNameTaken)
	require.ErrorIs(t, err, location.ErrConflict)
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(second))
	require.ErrorIs(t, err, location.ErrNotFound)
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-n2"))

	elsewhere := node("rid-n3", "roam-entry-n3", 1)
	elsewhere.Mesh, elsewhere.Name = "other-mesh", "node-a"
	_, err = s.ClaimNode(ctx(t), elsewhere, h.LeaseTTL)
	require.NoError(t, err, "names are unique per mesh")

	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(first))
	require.NoError(t, err)
	require.Equal(t, "node-a", got.Node.GetName())
	require.NoError(t, s.ReleaseNode(ctx(t), got.Node))
	second.EntrySpotId = "roam-entry-n2b"
	_, err = s.ClaimNode(ctx(t), second, h.LeaseTTL)
	require.NoError(t, err, "a released name is free")
}

// If the descriptor or the Entry Spot ID is already claimed, the claim
// changes nothing: no descriptor, no Entry claim, no second UUID.
// Reference: PROTOCOL.md §3.4.
func testEntryClaimConflict(t *testing.T, h Harness) {
	s := open(t, h).Store
	first := node("rid-a", "roam-entry-shared", 1)
	_, err := s.ClaimNode(ctx(t), first, h.LeaseTTL)
	require.NoError(t, err)

	// Another node claiming the same Entry Spot ID: its descriptor must not appear.
	second := node("rid-b", "roam-entry-shared", 1)
	_, err = s.ClaimNode(ctx(t), second, h.LeaseTTL)
	c := requireConflict(t, err)
	cur, ok := c.CurrentOf(location.Key(location.KindEntry, "roam-entry-shared"))
	require.True(t, ok)
	require.Equal(t, "rid-a", cur.Record.GetOwner().GetNodeRid())
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(second))
	require.ErrorIs(t, err, location.ErrNotFound)

	// The same descriptor with a fresh Entry ID: the new Entry claim must not appear.
	again := node("rid-a", "roam-entry-fresh", 2)
	_, err = s.ClaimNode(ctx(t), again, h.LeaseTTL)
	requireConflict(t, err)
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-fresh"))
	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(first))
	require.NoError(t, err)
	require.EqualValues(t, 1, got.Node.GetNodeGeneration())

	// An Entry Spot ID taken by a plain record is a conflict too.
	_, err = s.CompareAndSet(ctx(t), location.Key(location.KindEntry, "roam-entry-taken"), 0, rec("x", 1))
	require.NoError(t, err)
	third := node("rid-c", "roam-entry-taken", 1)
	_, err = s.ClaimNode(ctx(t), third, h.LeaseTTL)
	requireConflict(t, err)
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(third))
	require.ErrorIs(t, err, location.ErrNotFound)
}

// A lease renewed within its TTL stays in force past it.
// Reference: PROTOCOL.md §3.4 (claims under an owner lease).
func testRenewKeepsLease(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	n := node("rid-renew", "roam-entry-renew", 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		in.Pass(h.LeaseTTL / 2)
		require.NoError(t, s.RenewLease(ctx(t), lease.ID))
	}
	alive, err := s.LeaseAlive(ctx(t), lease.ID)
	require.NoError(t, err)
	require.True(t, alive)
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
}

// Every renewal changes the version of the descriptor the lease holds:
// the heartbeat other nodes watch.
// Reference: docs/FAULTS.md, "Other nodes take over a TTL after the last heartbeat".
func testRenewIsAHeartbeat(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-beat", "roam-entry-beat", 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	before, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		require.NoError(t, s.RenewLease(ctx(t), lease.ID))
		after, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
		require.NoError(t, err)
		require.NotEqual(t, before.Version, after.Version, "renewal %d changed nothing another node can see", i)
		require.True(t, proto.Equal(before.Node, after.Node), "the descriptor itself stays")
		before = after
	}
}

// A lease is revoked only at the descriptor version the revoker saw: a
// holder that renewed since keeps it. Revoked, it is gone with its
// descriptor and Entry claim, its renewal fails NotFound and its writes'
// lease check fails.
// Reference: docs/FAULTS.md, "Other nodes take over a TTL after the last heartbeat".
func testRevokeLease(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-revoke", "roam-entry-revoke", 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	seen, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	require.NoError(t, s.RenewLease(ctx(t), lease.ID))
	requireConflict(t, s.RevokeLease(ctx(t), location.NodeKeyOf(n), seen.Version))
	alive, err := s.LeaseAlive(ctx(t), lease.ID)
	require.NoError(t, err)
	require.True(t, alive, "renewed since: not revoked")

	seen, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	require.NoError(t, s.RevokeLease(ctx(t), location.NodeKeyOf(n), seen.Version))
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.ErrorIs(t, err, location.ErrLeaseRevoked, "revoked, not merely gone")
	require.ErrorIs(t, err, location.ErrNotFound)
	require.ErrorIs(t, s.RenewLease(ctx(t), lease.ID), location.ErrNotFound)
	_, err = s.Apply(ctx(t), []location.Op{location.CreateOp(location.Key(location.KindInstanceSpot, "after-revoke"), rec("a", 1)),
		location.CheckLeaseOp(location.NodeKeyOf(n), lease.ID)})
	require.ErrorIs(t, err, location.ErrLeaseEnded)
	_, err = s.Read(ctx(t), location.Key(location.KindEntry, n.GetEntrySpotId()))
	require.ErrorIs(t, err, location.ErrNotFound, "the Entry claim went with the lease")
	require.ErrorIs(t, s.RevokeLease(ctx(t), location.NodeKeyOf(n), seen.Version), location.ErrNotFound)
}

// When an owner lease ends unrenewed, its descriptor and Entry claim go
// with it and the same identity can be claimed again.
// Reference: PROTOCOL.md §3.4, §3.6 (Consul ends a session between one and two TTLs).
func testLeaseExpiry(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	n := node("rid-expire", "roam-entry-expire", 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "lease ends", func() bool {
		alive, err := s.LeaseAlive(ctx(t), lease.ID)
		require.NoError(t, err)
		return !alive
	})
	eventually(t, 10*time.Second, "claim freed", func() bool {
		_, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
		return errors.Is(err, location.ErrNotFound)
	})
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-expire"))
	require.ErrorIs(t, s.RenewLease(ctx(t), lease.ID), location.ErrNotFound)

	_, err = s.ClaimNode(ctx(t), node("rid-expire", "roam-entry-expire-2", 2), h.LeaseTTL)
	require.NoError(t, err)
}

// Cleanup by a previous lifecycle (old lease, old generation) of the same
// node identity deletes nothing of the replacement lifecycle.
// Reference: PROTOCOL.md §3.4 (a stale cleanup cannot remove a later lifecycle's claim).
func testStaleRelease(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	old := node("rid-same", "roam-entry-old", 1)
	oldLease, err := s.ClaimNode(ctx(t), old, h.LeaseTTL)
	require.NoError(t, err)
	old.LeaseId = string(oldLease.ID)
	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "old lease ends", func() bool {
		_, err := s.ReadNode(ctx(t), location.NodeKeyOf(old))
		return errors.Is(err, location.ErrNotFound)
	})

	repl := node("rid-same", "roam-entry-new", 2)
	replLease, err := s.ClaimNode(ctx(t), repl, h.LeaseTTL)
	require.NoError(t, err)

	err = s.ReleaseNode(ctx(t), old)
	requireConflict(t, err)

	// Same lease ID but an older generation is stale too.
	forged := node("rid-same", "roam-entry-new", 1)
	forged.LeaseId = string(replLease.ID)
	requireConflict(t, s.ReleaseNode(ctx(t), forged))

	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(repl))
	require.NoError(t, err)
	require.EqualValues(t, 2, got.Node.GetNodeGeneration())
	require.Equal(t, string(replLease.ID), got.Node.GetLeaseId())
	entry, err := s.Read(ctx(t), location.Key(location.KindEntry, "roam-entry-new"))
	require.NoError(t, err)
	require.Equal(t, string(replLease.ID), entry.Record.GetOwner().GetLeaseId())
	alive, err := s.LeaseAlive(ctx(t), replLease.ID)
	require.NoError(t, err)
	require.True(t, alive)
}

// Release by the lifecycle that claimed deletes descriptor and Entry claim
// together and ends the lease. Reference: PROTOCOL.md §3.4.
func testReleaseNode(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-release", "roam-entry-release", 3)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	n.LeaseId = string(lease.ID)
	require.NoError(t, s.ReleaseNode(ctx(t), n))
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.ErrorIs(t, err, location.ErrNotFound)
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-release"))
	alive, err := s.LeaseAlive(ctx(t), lease.ID)
	require.NoError(t, err)
	assert.False(t, alive)
	require.ErrorIs(t, s.ReleaseNode(ctx(t), n), location.ErrNotFound)
}

// A write that carries its writer's lease check applies only while that
// lease is live and holds the writer's descriptor: another lease, a lease
// of another node, or a released lease fails the whole transaction with
// ErrLeaseEnded (never a Conflict a caller might retry) and writes nothing.
// Reference: PROTOCOL.md §10 (one owner at a time), §3.2 (every write
// carries the writer's lease check).
func testLeaseCheck(t *testing.T, h Harness) {
	s := open(t, h).Store
	a := node("rid-check-a", "roam-entry-check-a", 1)
	la, err := s.ClaimNode(ctx(t), a, h.LeaseTTL)
	require.NoError(t, err)
	a.LeaseId = string(la.ID)
	b := node("rid-check-b", "roam-entry-check-b", 1)
	lb, err := s.ClaimNode(ctx(t), b, h.LeaseTTL)
	require.NoError(t, err)

	key := location.Key(location.KindInstanceSpot, "leased")
	v, err := s.Apply(ctx(t), []location.Op{location.CreateOp(key, rec("a", 1)), location.CheckLeaseOp(location.NodeKeyOf(a), la.ID)})
	require.NoError(t, err)
	require.NotZero(t, v[0])

	for name, op := range map[string]location.Op{
		"another node's lease": location.CheckLeaseOp(location.NodeKeyOf(a), lb.ID),
		"a node never claimed": location.CheckLeaseOp(location.NodeKey{Mesh: "m", NodeRid: "rid-none"}, la.ID),
	} {
		_, err = s.Apply(ctx(t), []location.Op{location.UpdateOp(key, v[0], rec("a", 2)), op})
		require.ErrorIs(t, err, location.ErrLeaseEnded, name)
		require.NotErrorIs(t, err, location.ErrConflict, name)
	}
	got, err := s.Read(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, v[0], got.Version, "a failed lease check writes nothing")

	require.NoError(t, s.ReleaseNode(ctx(t), a))
	_, err = s.Apply(ctx(t), []location.Op{location.UpdateOp(key, v[0], rec("a", 3)), location.CheckLeaseOp(location.NodeKeyOf(a), la.ID)})
	require.ErrorIs(t, err, location.ErrLeaseEnded)
	require.ErrorIs(t, err, location.ErrUnavailable, "a caller that only knows the retry classes sees Unavailable")
	got, err = s.Read(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, v[0], got.Version)

	_, err = s.Apply(ctx(t), []location.Op{location.CheckLeaseOp(location.NodeKeyOf(a), la.ID), location.CheckLeaseOp(location.NodeKeyOf(b), lb.ID)})
	require.ErrorIs(t, err, location.ErrInvalid, "one lease check per transaction")
	_, err = s.Apply(ctx(t), []location.Op{location.CheckLeaseOp(location.NodeKeyOf(b), "")})
	require.ErrorIs(t, err, location.ErrInvalid)
}

// A lease that expired unrenewed fails the check: a node cut off from the
// store can never commit late. Reference: PROTOCOL.md §3.2;
// docs/FAULTS.md ("A late write cannot land").
func testLeaseCheckAfterExpiry(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	n := node("rid-check-expire", "roam-entry-check-expire", 1)
	lease, err := s.ClaimNode(ctx(t), n, h.LeaseTTL)
	require.NoError(t, err)
	key := location.Key(location.KindActor, "late")
	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "lease ends", func() bool {
		alive, err := s.LeaseAlive(ctx(t), lease.ID)
		require.NoError(t, err)
		return !alive
	})
	_, err = s.Apply(ctx(t), []location.Op{location.CreateOp(key, rec("a", 1)), location.CheckLeaseOp(location.NodeKeyOf(n), lease.ID)})
	require.ErrorIs(t, err, location.ErrLeaseEnded)
	requireAbsent(t, s, key)
}

// draining is desc republished as DRAINING with another capacity: what a
// node that starts to drain writes with UpdateNode.
func draining(desc *location.NodeDescriptor, capacity uint32) *location.NodeDescriptor {
	next := proto.Clone(desc).(*location.NodeDescriptor)
	next.Status = messages.NodeStatus_NODE_STATUS_DRAINING
	next.Capacity = capacity
	return next
}

// claimed claims n and returns its descriptor as stored (with its lease).
func claimed(t *testing.T, s location.Store, n *location.NodeDescriptor, ttl time.Duration) location.VersionedNode {
	t.Helper()
	_, err := s.ClaimNode(ctx(t), n, ttl)
	require.NoError(t, err)
	cur, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	return cur
}

// requireNodeAt checks that the descriptor of key is still the one at
// version want, with status and capacity.
func requireNodeAt(t *testing.T, s location.Store, key location.NodeKey, want location.StoreVersion, status messages.NodeStatus, capacity uint32) {
	t.Helper()
	got, err := s.ReadNode(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, want, got.Version)
	require.Equal(t, status, got.Node.GetStatus())
	require.Equal(t, capacity, got.Node.GetCapacity())
}

// A node republishes its descriptor under its lease: the change is a new
// version that ReadNode and ListNodes return; an update at a stale
// version changes nothing; the same descriptor again is a new version too.
func testUpdateNode(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-update", "roam-entry-update", 1)
	cur := claimed(t, s, n, h.LeaseTTL)
	key := location.NodeKeyOf(n)

	next := draining(cur.Node, 5)
	v2, err := s.UpdateNode(ctx(t), next, cur.Version)
	require.NoError(t, err)
	require.Greater(t, v2, cur.Version)
	got, err := s.ReadNode(ctx(t), key)
	require.NoError(t, err)
	require.Equal(t, v2, got.Version)
	require.Equal(t, messages.NodeStatus_NODE_STATUS_DRAINING, got.Node.GetStatus())
	require.EqualValues(t, 5, got.Node.GetCapacity())
	require.Equal(t, cur.Node.GetLeaseId(), got.Node.GetLeaseId())
	nodes, err := s.ListNodes(ctx(t), "mesh")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, v2, nodes[0].Version)
	require.Equal(t, messages.NodeStatus_NODE_STATUS_DRAINING, nodes[0].Node.GetStatus())

	_, err = s.UpdateNode(ctx(t), draining(cur.Node, 7), cur.Version)
	requireConflict(t, err)
	requireNodeAt(t, s, key, v2, messages.NodeStatus_NODE_STATUS_DRAINING, 5)

	v3, err := s.UpdateNode(ctx(t), next, v2)
	require.NoError(t, err)
	require.Greater(t, v3, v2)
	_, err = s.UpdateNode(ctx(t), next, v2)
	requireConflict(t, err)
	requireNodeAt(t, s, key, v3, messages.NodeStatus_NODE_STATUS_DRAINING, 5)
}

// The fields that identify a lifecycle and where it is reached cannot
// change in an update: ErrInvalid (a malformed request, not a race to
// retry), and nothing is written.
func testUpdateNodeFixedFields(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-fixed", "roam-entry-fixed", 3)
	n.Name = "fixed-name"
	cur := claimed(t, s, n, h.LeaseTTL)
	for name, change := range map[string]func(*location.NodeDescriptor){
		"name":            func(d *location.NodeDescriptor) { d.Name = "other-name" },
		"name dropped":    func(d *location.NodeDescriptor) { d.Name = "" },
		"address":         func(d *location.NodeDescriptor) { d.Address = "127.0.0.1:7001" },
		"entry spot id":   func(d *location.NodeDescriptor) { d.EntrySpotId = "roam-entry-other" },
		"node generation": func(d *location.NodeDescriptor) { d.NodeGeneration = 4 },
		"no lease id":     func(d *location.NodeDescriptor) { d.LeaseId = "" },
	} {
		next := draining(cur.Node, 1)
		change(next)
		_, err := s.UpdateNode(ctx(t), next, cur.Version)
		require.ErrorIs(t, err, location.ErrInvalid, name)
		require.NotErrorIs(t, err, location.ErrConflict, name)
	}
	_, err := s.UpdateNode(ctx(t), nil, cur.Version)
	require.ErrorIs(t, err, location.ErrInvalid)
	requireNodeAt(t, s, location.NodeKeyOf(n), cur.Version, messages.NodeStatus_NODE_STATUS_SERVING, 100)
}

// An update that names another live lease than the one holding the
// descriptor is a conflict and writes nothing; one for a node never
// claimed is ErrNotFound.
func testUpdateNodeOtherLease(t *testing.T, h Harness) {
	s := open(t, h).Store
	a := claimed(t, s, node("rid-lease-a", "roam-entry-lease-a", 1), h.LeaseTTL)
	b := claimed(t, s, node("rid-lease-b", "roam-entry-lease-b", 1), h.LeaseTTL)

	forged := draining(a.Node, 1)
	forged.LeaseId = b.Node.GetLeaseId()
	_, err := s.UpdateNode(ctx(t), forged, a.Version)
	requireConflict(t, err)
	requireNodeAt(t, s, location.NodeKeyOf(a.Node), a.Version, messages.NodeStatus_NODE_STATUS_SERVING, 100)

	never := draining(a.Node, 1)
	never.NodeRid = "rid-never-claimed"
	_, err = s.UpdateNode(ctx(t), never, a.Version)
	require.ErrorIs(t, err, location.ErrNotFound)
}

// Once its lease has ended a lifecycle can no longer update its
// descriptor: ErrNotFound while the node is gone, ErrLeaseEnded once a
// replacement lifecycle holds it — never success, and never a conflict a
// caller would retry.
func testUpdateNodeAfterLeaseEnd(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	n := node("rid-update-end", "roam-entry-update-end", 1)
	cur := claimed(t, s, n, h.LeaseTTL)
	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "lease ends", func() bool {
		alive, err := s.LeaseAlive(ctx(t), location.LeaseID(cur.Node.GetLeaseId()))
		require.NoError(t, err)
		return !alive
	})
	late := draining(cur.Node, 1)
	_, err := s.UpdateNode(ctx(t), late, cur.Version)
	require.True(t, errors.Is(err, location.ErrNotFound) || errors.Is(err, location.ErrLeaseEnded), "update after the lease ended: %v", err)
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.ErrorIs(t, err, location.ErrNotFound)

	repl := claimed(t, s, node("rid-update-end", "roam-entry-update-end-2", 2), h.LeaseTTL)
	for _, at := range []location.StoreVersion{cur.Version, repl.Version} {
		_, err = s.UpdateNode(ctx(t), late, at)
		require.ErrorIs(t, err, location.ErrLeaseEnded, "at version %d", at)
		require.NotErrorIs(t, err, location.ErrConflict)
	}
	got, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.NoError(t, err)
	require.Equal(t, repl.Version, got.Version)
	require.EqualValues(t, 2, got.Node.GetNodeGeneration())
	require.Equal(t, messages.NodeStatus_NODE_STATUS_SERVING, got.Node.GetStatus())
}

// An updated descriptor is still held by the lease: when the lease ends
// unrenewed the descriptor, Entry claim and name go, as if never updated.
func testUpdatedNodeEndsWithLease(t *testing.T, h Harness) {
	in := open(t, h)
	s := in.Store
	n := node("rid-updated-expire", "roam-entry-updated-expire", 1)
	n.Name = "updated-expire"
	cur := claimed(t, s, n, h.LeaseTTL)
	_, err := s.UpdateNode(ctx(t), draining(cur.Node, 1), cur.Version)
	require.NoError(t, err)

	in.Pass(h.LeaseTTL + time.Second)
	eventually(t, h.Expiry+10*time.Second, "lease ends", func() bool {
		alive, err := s.LeaseAlive(ctx(t), location.LeaseID(cur.Node.GetLeaseId()))
		require.NoError(t, err)
		return !alive
	})
	eventually(t, 10*time.Second, "updated descriptor deleted", func() bool {
		_, err := s.ReadNode(ctx(t), location.NodeKeyOf(n))
		return errors.Is(err, location.ErrNotFound)
	})
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-updated-expire"))
	again := node("rid-updated-expire", "roam-entry-updated-expire-2", 2)
	again.Name = "updated-expire"
	_, err = s.ClaimNode(ctx(t), again, h.LeaseTTL)
	require.NoError(t, err)
}

// An updated descriptor is released like a fresh one: descriptor and
// Entry claim deleted, lease ended.
func testUpdatedNodeReleased(t *testing.T, h Harness) {
	s := open(t, h).Store
	n := node("rid-updated-release", "roam-entry-updated-release", 1)
	cur := claimed(t, s, n, h.LeaseTTL)
	next := draining(cur.Node, 1)
	_, err := s.UpdateNode(ctx(t), next, cur.Version)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseNode(ctx(t), next))
	_, err = s.ReadNode(ctx(t), location.NodeKeyOf(n))
	require.ErrorIs(t, err, location.ErrNotFound)
	requireAbsent(t, s, location.Key(location.KindEntry, "roam-entry-updated-release"))
	alive, err := s.LeaseAlive(ctx(t), location.LeaseID(cur.Node.GetLeaseId()))
	require.NoError(t, err)
	require.False(t, alive)
}

// openBoard opens an instance whose store must also be a location.Board.
func openBoard(t *testing.T, h Harness) (location.Store, location.Board) {
	t.Helper()
	in := open(t, h)
	b, ok := in.Store.(location.Board)
	require.True(t, ok, "%T does not implement location.Board", in.Store)
	return in.Store, b
}

func noteKey(rid, name string) location.NoteKey {
	return location.NoteKey{Mesh: "mesh", NodeRid: rid, Name: name}
}

// requireNote checks that key holds value at version.
func requireNote(t *testing.T, b location.Board, key location.NoteKey, version location.StoreVersion, value string) {
	t.Helper()
	got, err := b.ReadNote(ctx(t), key)
	require.NoError(t, err, "%s", key)
	require.Equal(t, key, got.Key)
	require.Equal(t, version, got.Version, "%s", key)
	require.Equal(t, value, string(got.Value), "%s", key)
}

func requireNoNote(t *testing.T, b location.Board, key location.NoteKey) {
	t.Helper()
	_, err := b.ReadNote(ctx(t), key)
	require.ErrorIs(t, err, location.ErrNotFound, "%s must be absent", key)
}

// A note is created only while absent, then written by version: a stale
// version, or a version for a note that does not exist, is a conflict
// and writes nothing.
func testNoteWrite(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	key := noteKey("rid-note", "requests")
	v1, err := b.WriteNote(ctx(t), key, 0, []byte(`{"requests":[]}`))
	require.NoError(t, err)
	require.NotZero(t, v1)
	_, err = b.WriteNote(ctx(t), key, 0, []byte(`{"other":1}`))
	requireConflict(t, err)
	requireNote(t, b, key, v1, `{"requests":[]}`)

	v2, err := b.WriteNote(ctx(t), key, v1, []byte(`{"requests":[{"id":"a"}]}`))
	require.NoError(t, err)
	require.Greater(t, v2, v1)
	_, err = b.WriteNote(ctx(t), key, v1, []byte(`{"stale":true}`))
	requireConflict(t, err)
	requireNote(t, b, key, v2, `{"requests":[{"id":"a"}]}`)

	absent := noteKey("rid-note", "status-1")
	_, err = b.WriteNote(ctx(t), absent, v2, []byte(`{}`))
	requireConflict(t, err)
	requireNoNote(t, b, absent)
}

// Writing the bytes a note already holds is still a new version, so a
// write at the old version afterwards loses (Consul keeps ModifyIndex for
// identical bytes).
func testNoteRewrite(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	key := noteKey("rid-rewrite", "status-1")
	v1, err := b.WriteNote(ctx(t), key, 0, []byte(`{"state":"RUNNING"}`))
	require.NoError(t, err)
	v2, err := b.WriteNote(ctx(t), key, v1, []byte(`{"state":"RUNNING"}`))
	require.NoError(t, err)
	require.Greater(t, v2, v1)
	_, err = b.WriteNote(ctx(t), key, v1, []byte(`{"state":"RUNNING"}`))
	requireConflict(t, err)
	requireNote(t, b, key, v2, `{"state":"RUNNING"}`)
}

// noteValues are values a store's encoding could alter: JSON with spaces,
// HTML characters or surrounding whitespace, bare JSON scalars, bytes
// that are not JSON or not UTF-8, nothing.
var noteValues = []string{
	`{"requests": [ {"id": "a"} ]}`, `{"a":1}`, `{"s":"<&>\u00e9"}`, ` {"a":1}`, "{\"a\":1}\n",
	`"text"`, `null`, `12`, `[]`, "plain text", "\x00\xff\xfe{", "\"\xff\"", "",
}

// A note reads back, lists and watches byte for byte as written.
func testNoteValues(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	versions := map[location.NoteKey]location.StoreVersion{}
	for i, value := range noteValues {
		key := noteKey("rid-values", fmt.Sprintf("value-%02d", i))
		v, err := b.WriteNote(ctx(t), key, 0, []byte(value))
		require.NoError(t, err, "%q", value)
		versions[key] = v
		requireNote(t, b, key, v, value)
		got, err := b.WatchNote(ctx(t), key, 0)
		require.NoError(t, err)
		require.Equal(t, value, string(got.Value), "%q", value)
	}
	notes, err := b.ListNotes(ctx(t), "mesh")
	require.NoError(t, err)
	require.Len(t, notes, len(noteValues))
	for i, n := range notes {
		require.Equal(t, fmt.Sprintf("value-%02d", i), n.Key.Name)
		require.Equal(t, versions[n.Key], n.Version)
		require.Equal(t, noteValues[i], string(n.Value), "%s", n.Key)
	}
}

// ReadNote of a missing note is NotFound. DeleteNote deletes at any
// version (0) or only at the version named (a stale one is a conflict);
// deleting a missing note is not an error. A delete leaves other notes.
func testNoteDelete(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	key := noteKey("rid-delete", "status-1")
	neighbour := noteKey("rid-delete", "status-2")
	requireNoNote(t, b, key)
	require.NoError(t, b.DeleteNote(ctx(t), key, 0))
	require.NoError(t, b.DeleteNote(ctx(t), key, 12345))

	vn, err := b.WriteNote(ctx(t), neighbour, 0, []byte(`{"n":1}`))
	require.NoError(t, err)
	v1, err := b.WriteNote(ctx(t), key, 0, []byte(`{"v":1}`))
	require.NoError(t, err)
	v2, err := b.WriteNote(ctx(t), key, v1, []byte(`{"v":2}`))
	require.NoError(t, err)
	requireConflict(t, b.DeleteNote(ctx(t), key, v1))
	requireNote(t, b, key, v2, `{"v":2}`)
	require.NoError(t, b.DeleteNote(ctx(t), key, v2))
	requireNoNote(t, b, key)

	_, err = b.WriteNote(ctx(t), key, 0, []byte(`{"v":3}`))
	require.NoError(t, err, "a deleted note can be created again")
	require.NoError(t, b.DeleteNote(ctx(t), key, 0))
	requireNoNote(t, b, key)
	requireNote(t, b, neighbour, vn, `{"n":1}`)
}

// parkedIn waits until a goroutine is blocked inside fn (its stack names
// fn and it waits in a select or on a channel: memstore's wake-up, or
// Consul's blocking query), so that a write made next is one the watch
// must be woken by, not one it happens to read on its way in.
func parkedIn(t *testing.T, fn string) {
	t.Helper()
	eventually(t, 30*time.Second, "a goroutine blocked in "+fn, func() bool {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			blocked := strings.Contains(header, "[select") || strings.Contains(header, "[chan receive")
			if blocked && strings.Contains(g, fn) {
				return true
			}
		}
		return false
	})
}

// WatchNote returns once the note leaves the version it was given:
// created, written or deleted (Version 0); at once when it already has;
// with an error when its context ends.
func testNoteWatch(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	key := noteKey("rid-watch", "requests")
	type result struct {
		n   location.Note
		err error
	}
	watch := func(c context.Context, after location.StoreVersion) <-chan result {
		ch := make(chan result, 1)
		go func() {
			n, err := b.WatchNote(c, key, after)
			ch <- result{n, err}
		}()
		return ch
	}

	created := watch(ctx(t), 0)
	parkedIn(t, ".WatchNote(")
	v1, err := b.WriteNote(ctx(t), key, 0, []byte(`{"v":1}`))
	require.NoError(t, err)
	r := <-created
	require.NoError(t, r.err)
	require.Equal(t, v1, r.n.Version)
	require.Equal(t, `{"v":1}`, string(r.n.Value))

	written := watch(ctx(t), v1)
	parkedIn(t, ".WatchNote(")
	v2, err := b.WriteNote(ctx(t), key, v1, []byte(`{"v":1}`))
	require.NoError(t, err)
	r = <-written
	require.NoError(t, r.err)
	require.Equal(t, v2, r.n.Version, "a rewrite of the same bytes wakes the watch")

	deleted := watch(ctx(t), v2)
	parkedIn(t, ".WatchNote(")
	require.NoError(t, b.DeleteNote(ctx(t), key, v2))
	r = <-deleted
	require.NoError(t, r.err)
	require.Zero(t, r.n.Version)
	require.Empty(t, r.n.Value)
	require.Equal(t, key, r.n.Key)

	// Already past: the stale version, and a deleted note, return at once.
	r = <-watch(ctx(t), v2)
	require.NoError(t, r.err)
	require.Zero(t, r.n.Version)
	v3, err := b.WriteNote(ctx(t), key, 0, []byte(`{"v":3}`))
	require.NoError(t, err)
	r = <-watch(ctx(t), v1)
	require.NoError(t, r.err)
	require.Equal(t, v3, r.n.Version)

	c, cancel := context.WithCancel(context.Background())
	ended := watch(c, v3)
	parkedIn(t, ".WatchNote(")
	cancel()
	select {
	case r = <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("WatchNote did not return when its context ended")
	}
	require.ErrorIs(t, r.err, location.ErrUnavailable)
	require.ErrorIs(t, r.err, context.Canceled)
}

// ListNotes returns a mesh's notes ("": every mesh's) ordered by mesh,
// node RID and name, comparing the IDs themselves, whatever a store's
// key encoding would order them by; a mesh's notes leave out those of a
// mesh whose name it prefixes.
func testNoteList(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	keys := []location.NoteKey{
		{Mesh: "b", NodeRid: "r1", Name: "requests"},
		{Mesh: "a", NodeRid: "r.", Name: "requests"},
		{Mesh: "mesh/🚀", NodeRid: "rid 100%", Name: "status-x"},
		{Mesh: "a", NodeRid: "r-", Name: "status-2"},
		{Mesh: "ab", NodeRid: "r1", Name: "requests"},
		{Mesh: "a", NodeRid: "r-", Name: "requests"},
	}
	versions := map[location.NoteKey]location.StoreVersion{}
	for i, k := range keys {
		v, err := b.WriteNote(ctx(t), k, 0, []byte(fmt.Sprintf(`{"i":%d}`, i)))
		require.NoError(t, err, "%s", k)
		versions[k] = v
	}
	listed := func(mesh string) []location.NoteKey {
		notes, err := b.ListNotes(ctx(t), mesh)
		require.NoError(t, err)
		out := []location.NoteKey{}
		for _, n := range notes {
			require.Equal(t, versions[n.Key], n.Version, "%s", n.Key)
			require.NotEmpty(t, n.Value, "%s", n.Key)
			out = append(out, n.Key)
		}
		return out
	}
	require.Equal(t, []location.NoteKey{keys[5], keys[3], keys[1], keys[4], keys[0], keys[2]}, listed(""))
	require.Equal(t, []location.NoteKey{keys[5], keys[3], keys[1]}, listed("a"))
	require.Equal(t, []location.NoteKey{keys[2]}, listed("mesh/🚀"))
	require.Empty(t, listed("none"))
	_, err := b.ListNotes(ctx(t), "bad\xff")
	require.ErrorIs(t, err, location.ErrInvalid)
}

// Keys with a bad mesh, RID or name are refused by every call before
// anything is written.
func testNoteInvalidKeys(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	for name, key := range map[string]location.NoteKey{
		"empty name":         noteKey("rid", ""),
		"name with a slash":  noteKey("rid", "a/b"),
		"name with a space":  noteKey("rid", "a b"),
		"name of a dot":      noteKey("rid", "."),
		"name of two dots":   noteKey("rid", ".."),
		"name after a dot":   noteKey("rid", ".hidden"),
		"name of 129 bytes":  noteKey("rid", strings.Repeat("n", 129)),
		"name not ASCII":     noteKey("rid", "é"),
		"empty rid":          noteKey("", "requests"),
		"rid not UTF-8":      noteKey("bad\xff", "requests"),
		"empty mesh":         {NodeRid: "rid", Name: "requests"},
		"mesh of 256 bytes":  {Mesh: strings.Repeat("m", 256), NodeRid: "rid", Name: "requests"},
		"rid of 256 bytes":   noteKey(strings.Repeat("r", 256), "requests"),
		"name with a colon":  noteKey("rid", "a:b"),
		"name with percent":  noteKey("rid", "100%"),
		"name with a tilde":  noteKey("rid", "a~b"),
		"name with newline":  noteKey("rid", "a\nb"),
		"name starting dash": noteKey("rid", "-a"),
	} {
		_, err := b.WriteNote(ctx(t), key, 0, []byte(`{}`))
		require.ErrorIs(t, err, location.ErrInvalid, name)
		_, err = b.ReadNote(ctx(t), key)
		require.ErrorIs(t, err, location.ErrInvalid, name)
		require.ErrorIs(t, b.DeleteNote(ctx(t), key, 0), location.ErrInvalid, name)
		_, err = b.WatchNote(ctx(t), key, 0)
		require.ErrorIs(t, err, location.ErrInvalid, name)
	}
	notes, err := b.ListNotes(ctx(t), "")
	require.NoError(t, err)
	require.Empty(t, notes)

	longest := noteKey("rid", "N0._-"+strings.Repeat("n", 123))
	v, err := b.WriteNote(ctx(t), longest, 0, []byte(`{}`))
	require.NoError(t, err)
	requireNote(t, b, longest, v, `{}`)
}

// A value over MaxNoteBytes is TooLarge and writes nothing; one of
// exactly MaxNoteBytes, JSON or not, is stored whole.
func testNoteTooLarge(t *testing.T, h Harness) {
	_, b := openBoard(t, h)
	key := noteKey("rid-large", "requests")
	_, err := b.WriteNote(ctx(t), key, 0, make([]byte, location.MaxNoteBytes+1))
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireNoNote(t, b, key)

	binary := string(rootBytes(7, location.MaxNoteBytes))
	v1, err := b.WriteNote(ctx(t), key, 0, []byte(binary))
	require.NoError(t, err)
	requireNote(t, b, key, v1, binary)
	_, err = b.WriteNote(ctx(t), key, v1, []byte(binary+"x"))
	require.ErrorIs(t, err, location.ErrTooLarge)
	requireNote(t, b, key, v1, binary)

	text := `"` + strings.Repeat("x", location.MaxNoteBytes-2) + `"`
	v2, err := b.WriteNote(ctx(t), key, v1, []byte(text))
	require.NoError(t, err)
	requireNote(t, b, key, v2, text)
}

// SweepNotes deletes the notes of the lifecycles of a mesh that have no
// descriptor (released, or never claimed) and keeps those of live ones
// and of other meshes; a second sweep finds nothing.
func testSweepNotes(t *testing.T, h Harness) {
	s, b := openBoard(t, h)
	claimed(t, s, node("rid-sweep-live", "roam-entry-sweep-live", 1), h.LeaseTTL)
	gone := claimed(t, s, node("rid-sweep-gone", "roam-entry-sweep-gone", 1), h.LeaseTTL)
	require.NoError(t, s.ReleaseNode(ctx(t), gone.Node))

	live := []location.NoteKey{noteKey(location.ClusterNotes, "ledger"), noteKey("rid-sweep-live", "requests"), noteKey("rid-sweep-live", "status-1")}
	other := location.NoteKey{Mesh: "other-mesh", NodeRid: "rid-sweep-gone", Name: "requests"}
	for _, k := range append(live, other,
		noteKey("rid-sweep-gone", "requests"), noteKey("rid-sweep-gone", "status-1"), noteKey("rid-sweep-never", "requests")) {
		_, err := b.WriteNote(ctx(t), k, 0, []byte(`{}`))
		require.NoError(t, err, "%s", k)
	}
	keys := func() []location.NoteKey {
		notes, err := b.ListNotes(ctx(t), "")
		require.NoError(t, err)
		out := []location.NoteKey{}
		for _, n := range notes {
			out = append(out, n.Key)
		}
		return out
	}

	n, err := location.SweepNotes(ctx(t), s, b, "mesh")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, append(slices.Clone(live), other), keys())
	n, err = location.SweepNotes(ctx(t), s, b, "mesh")
	require.NoError(t, err)
	require.Zero(t, n)

	n, err = location.SweepNotes(ctx(t), s, b, "")
	require.NoError(t, err)
	require.Equal(t, 1, n, "a sweep of every mesh takes the other mesh's note of a node it does not have")
	require.Equal(t, live, keys())
}

// A store that reads several keys at once (location.KeysReader) answers
// each as Read does, in order, a missing one as absent; no keys is
// invalid. A store without it skips this test.
func testReadKeys(t *testing.T, h Harness) {
	s := open(t, h).Store
	kr, ok := s.(location.KeysReader)
	if !ok {
		t.Skipf("%T does not implement location.KeysReader", s)
	}
	a, b := location.Key(location.KindInstanceSpot, "both-a"), location.Key(location.KindUserSpot, "both-a")
	v, err := s.CompareAndSet(ctx(t), a, 0, rec("a", 1))
	require.NoError(t, err)
	got, err := kr.ReadKeys(ctx(t), a, b)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, a, got[0].Key)
	require.Equal(t, v, got[0].Version)
	require.True(t, got[0].Present())
	require.Equal(t, uint64(1), got[0].Record.GetObjectGeneration())
	require.Equal(t, b, got[1].Key)
	require.False(t, got[1].Present())
	require.Zero(t, got[1].Version)
	got, err = kr.ReadKeys(ctx(t), b, a)
	require.NoError(t, err)
	require.False(t, got[0].Present())
	require.Equal(t, v, got[1].Version)
	_, err = kr.ReadKeys(ctx(t))
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = kr.ReadKeys(ctx(t), location.AuthorityKey{Kind: location.KindActor})
	require.ErrorIs(t, err, location.ErrInvalid)
}
