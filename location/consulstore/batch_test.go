package consulstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/messages"
)

// createRecords creates n Instance Spot records named prefix-<i> and
// returns their keys and versions.
func createRecords(t *testing.T, s *consulstore.Store, prefix string, n int) ([]location.AuthorityKey, []location.StoreVersion) {
	keys := make([]location.AuthorityKey, n)
	versions := make([]location.StoreVersion, n)
	for i := range keys {
		keys[i] = location.Key(location.KindInstanceSpot, fmt.Sprintf("%s-%d", prefix, i))
		v, err := s.CompareAndSet(context.Background(), keys[i], 0, batchRecord(1))
		require.NoError(t, err)
		versions[i] = v
	}
	return keys, versions
}

func batchRecord(gen uint64) *location.Record {
	return &location.Record{StableType: "batch", ObjectGeneration: gen, AuthorityOwnerGeneration: 1, State: messages.LifecycleState_LIFECYCLE_STATE_READY}
}

// Concurrent compare-and-sets share transactions (group commit), and each
// caller still gets its own answer: a stale version is a conflict that
// carries its own key's record, two writes of one key never share a
// transaction (one applies, the other conflicts), and a rolled-back
// transaction applies nothing of the calls that did not fail: they are
// sent again and apply.
func TestBatchedWritesAnswerEachCall(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const n = 150
	keys, versions := createRecords(t, s, "batch", n)
	_, _, calls0, txns0 := consulstore.Sent(s)

	queued, release := consulstore.Hold(s, true)
	type answer struct {
		i   int
		dup bool
		err error
	}
	answers := make(chan answer, n+10)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			expected := versions[i]
			if i%3 == 0 {
				expected-- // stale
			}
			_, err := s.CompareAndSet(ctx, keys[i], expected, batchRecord(2))
			answers <- answer{i: i, err: err}
		}()
	}
	// Ten more writes of keys already written above, at the right version:
	// per key, exactly one of the two may apply.
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.CompareAndSet(ctx, keys[i*3+1], versions[i*3+1], batchRecord(3))
			answers <- answer{i: i*3 + 1, dup: true, err: err}
		}()
	}
	testwait.For(t, func() bool { return queued() == n+10 }, "the writes never queued")
	release()
	wg.Wait()
	close(answers)

	applied := map[int]int{}
	for a := range answers {
		var conflict *location.ConflictError
		switch {
		case a.err == nil:
			require.False(t, a.i%3 == 0, "a stale write of %s applied", keys[a.i])
			applied[a.i]++
		case errors.As(a.err, &conflict):
			cur, ok := conflict.CurrentOf(keys[a.i])
			require.True(t, ok, "the conflict of %s carries its record", keys[a.i])
			require.NotEqual(t, versions[a.i]-1, cur.Version)
			if a.i%3 == 0 {
				require.Equal(t, versions[a.i], cur.Version, "a stale write's conflict shows the record as it was")
			}
		default:
			t.Fatalf("write of %s: %v", keys[a.i], a.err)
		}
	}
	for i, key := range keys {
		v, err := s.Read(ctx, key)
		require.NoError(t, err)
		if i%3 == 0 {
			require.Equal(t, versions[i], v.Version, "%s: a stale write applied", key)
			require.Zero(t, applied[i])
			continue
		}
		require.Equal(t, 1, applied[i], "%s: one write of the key applies", key)
		require.Greater(t, v.Version, versions[i])
	}
	_, _, calls, txns := consulstore.Sent(s)
	require.Less(t, txns-txns0, (calls-calls0)/4, "the queued writes shared transactions")
}

// A write whose caller stops waiting before it was sent is never sent:
// unavailable (not indeterminate), and the record is unchanged.
func TestBatchedWriteLeftBeforeSendingNeverApplies(t *testing.T) {
	s := newStore(t)
	key := location.Key(location.KindInstanceSpot, "batch-left")
	v, err := s.CompareAndSet(context.Background(), key, 0, batchRecord(1))
	require.NoError(t, err)

	queued, release := consulstore.Hold(s, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.CompareAndSet(ctx, key, v, batchRecord(2))
		done <- err
	}()
	testwait.For(t, func() bool { return queued() == 1 }, "the write never queued")
	cancel()
	err = testwait.Recv(t, done, "the cancelled write returned")
	require.ErrorIs(t, err, location.ErrUnavailable)
	require.NotErrorIs(t, err, location.ErrIndeterminate)
	release()

	// A later write goes through the same queue: once it applied, the
	// one left behind had its chance to be sent, and was not.
	next := location.Key(location.KindInstanceSpot, "batch-after")
	_, err = s.CompareAndSet(context.Background(), next, 0, batchRecord(1))
	require.NoError(t, err)
	got, err := s.Read(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version, "the abandoned write applied")
}

// A transaction that carries a lease check fails alone when the lease
// ended; the others sent with it apply.
func TestBatchedWritesWithAnEndedLease(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	live := &location.NodeDescriptor{Mesh: "batch", NodeRid: "live", NodeGeneration: 1, EntrySpotId: "entry-live", Address: "127.0.0.1:7000",
		Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1}
	gone := &location.NodeDescriptor{Mesh: "batch", NodeRid: "gone", NodeGeneration: 1, EntrySpotId: "entry-gone", Address: "127.0.0.1:7001",
		Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1}
	liveLease, err := s.ClaimNode(ctx, live, 10*time.Second)
	require.NoError(t, err)
	goneLease, err := s.ClaimNode(ctx, gone, 10*time.Second)
	require.NoError(t, err)
	gone.LeaseId = string(goneLease.ID)
	require.NoError(t, s.ReleaseNode(ctx, gone))

	queued, release := consulstore.Hold(s, true)
	errs := make([]error, 6)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node, lease := location.NodeKey{Mesh: "batch", NodeRid: "live"}, liveLease.ID
			if i == 3 {
				node, lease = location.NodeKey{Mesh: "batch", NodeRid: "gone"}, goneLease.ID
			}
			_, errs[i] = s.Apply(ctx, []location.Op{
				location.CheckLeaseOp(node, lease),
				location.CreateOp(location.Key(location.KindActor, fmt.Sprintf("leased-%d", i)), batchRecord(1)),
			})
		}()
	}
	testwait.For(t, func() bool { return queued() == len(errs) }, "the writes never queued")
	release()
	wg.Wait()
	for i, err := range errs {
		_, rerr := s.Read(ctx, location.Key(location.KindActor, fmt.Sprintf("leased-%d", i)))
		if i == 3 {
			require.ErrorIs(t, err, location.ErrLeaseEnded)
			require.ErrorIs(t, rerr, location.ErrNotFound)
			continue
		}
		require.NoError(t, err)
		require.NoError(t, rerr)
	}
}

// Concurrent reads share read transactions, each answered with its own
// key: present, or NotFound.
func TestBatchedReadsAnswerEachCall(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	const n = 100
	for i := 0; i < n; i += 2 {
		_, err := s.CompareAndSet(ctx, location.Key(location.KindActor, fmt.Sprintf("read-%d", i)), 0, batchRecord(uint64(i+1)))
		require.NoError(t, err)
	}
	readCalls0, readTxns0, _, _ := consulstore.Sent(s)
	queued, release := consulstore.Hold(s, false)
	errs := make([]error, n)
	got := make([]location.Versioned, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = s.Read(ctx, location.Key(location.KindActor, fmt.Sprintf("read-%d", i)))
		}()
	}
	testwait.For(t, func() bool { return queued() == n }, "the reads never queued")
	release()
	wg.Wait()
	for i := 0; i < n; i++ {
		if i%2 == 1 {
			require.ErrorIs(t, errs[i], location.ErrNotFound)
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, uint64(i+1), got[i].Record.GetObjectGeneration())
	}
	readCalls, readTxns, _, _ := consulstore.Sent(s)
	require.Less(t, readTxns-readTxns0, (readCalls-readCalls0)/4, "the queued reads shared transactions")
}

// Watches beyond the blocking queries a store holds at once poll, and
// still end at their key's next change, each with its own record; a
// watch whose key does not change ends only with its context.
func TestManyWatchesEachSeeTheirChange(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 40
	keys, versions := createRecords(t, s, "watch", n)
	type seen struct {
		i   int
		v   location.Versioned
		err error
	}
	results := make(chan seen, n)
	for i := range keys {
		go func() {
			v, err := s.Watch(ctx, keys[i], versions[i])
			results <- seen{i, v, err}
		}()
	}
	written := map[int]location.StoreVersion{}
	for i := 0; i < n; i += 2 {
		v, err := s.CompareAndSet(ctx, keys[i], versions[i], batchRecord(2))
		require.NoError(t, err)
		written[i] = v
	}
	for range n / 2 {
		r := testwait.Recv(t, results, "a watch of a written key ended")
		require.NoError(t, r.err)
		require.Contains(t, written, r.i, "the watch of an unchanged key ended")
		require.Equal(t, written[r.i], r.v.Version)
		require.Equal(t, uint64(2), r.v.Record.GetObjectGeneration())
	}
	cancel()
	for range n / 2 {
		r := testwait.Recv(t, results, "a watch of an unchanged key ended with its context")
		require.NotContains(t, written, r.i)
		require.ErrorIs(t, r.err, location.ErrUnavailable)
	}
}

// A transaction that never answers (here: the only slot taken and never
// given back, as a request on a connection that leads nowhere would) does
// not hold up the Store's other calls: once nothing of their kind started
// or ended for a while, a waiting call starts another transaction.
func TestAStuckTransactionDoesNotHoldUpTheOthers(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	key := location.Key(location.KindActor, "unstuck")
	v, err := s.CompareAndSet(ctx, key, 0, batchRecord(1))
	require.NoError(t, err)
	consulstore.Jam(s)
	got, err := s.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version)
	_, err = s.CompareAndSet(ctx, key, v, batchRecord(2))
	require.NoError(t, err)
}

// Concurrent Applies with slot ops share transactions and each caller
// gets its own answer: a take of a held slot is a conflict naming the
// caller's own op (not the combined transaction's), the others apply —
// those sent with it again. Two Applies of one slot never share a
// transaction.
func TestBatchedSlotOpsAnswerEachCall(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	desc := &location.NodeDescriptor{Mesh: "batch", NodeRid: "slots", NodeGeneration: 1, EntrySpotId: "entry-slots", Address: "127.0.0.1:7000",
		Status: messages.NodeStatus_NODE_STATUS_SERVING, ProtocolVersion: 1}
	lease, err := s.ClaimNode(ctx, desc, 10*time.Second)
	require.NoError(t, err)
	nk := location.NodeKeyOf(desc)
	holder := func(i int) location.AuthorityKey {
		return location.Key(location.KindActor, fmt.Sprintf("slot-batch-%d", i))
	}
	const held = 5
	for i := 0; i < held; i++ {
		_, err := s.Apply(ctx, []location.Op{location.TakeSlotOp(nk, lease.ID, uint32(i), location.Key(location.KindActor, "before"), false)})
		require.NoError(t, err)
	}

	// Call i takes slot i; slots 0..held-1 are held. The lease check
	// first and the record before the take put the take at op 2 of its
	// call, and further still in the combined transaction.
	const n = 40
	_, _, calls0, txns0 := consulstore.Sent(s)
	queued, release := consulstore.Hold(s, true)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Apply(ctx, []location.Op{
				location.CheckLeaseOp(nk, lease.ID),
				location.CreateOp(holder(i), batchRecord(1)),
				location.TakeSlotOp(nk, lease.ID, uint32(i), holder(i), true),
			})
		}()
	}
	testwait.For(t, func() bool { return queued() == n }, "the writes never queued")
	release()
	wg.Wait()
	for i, err := range errs {
		_, rerr := s.Read(ctx, holder(i))
		if i < held {
			var c *location.ConflictError
			require.True(t, errors.As(err, &c), "call %d: %v", i, err)
			require.Equal(t, []int{2}, c.FailedOps, "call %d", i)
			require.ErrorIs(t, rerr, location.ErrNotFound)
			continue
		}
		require.NoError(t, err, "call %d", i)
		require.NoError(t, rerr)
	}
	_, _, calls, txns := consulstore.Sent(s)
	require.Less(t, txns-txns0, (calls-calls0)/4, "the queued writes shared transactions")
	slots, err := s.ListSlots(ctx, nk)
	require.NoError(t, err)
	require.Len(t, slots, n)
	for i, sl := range slots {
		require.EqualValues(t, i, sl.Index)
		if i >= held {
			require.Equal(t, location.Slot{Index: uint32(i), Holder: holder(i), Pending: true}, sl)
		}
	}

	// sendTwo queues two Applies and reports how many transactions
	// carried them, and their errors.
	sendTwo := func(a, b []location.Op) (int64, error, error) {
		_, _, _, txns0 := consulstore.Sent(s)
		queued, release := consulstore.Hold(s, true)
		var ea, eb error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _, ea = s.Apply(ctx, a) }()
		testwait.For(t, func() bool { return queued() == 1 }, "the first write never queued")
		wg.Add(1)
		go func() { defer wg.Done(); _, eb = s.Apply(ctx, b) }()
		testwait.For(t, func() bool { return queued() == 2 }, "the second write never queued")
		release()
		wg.Wait()
		_, _, _, txns := consulstore.Sent(s)
		return txns - txns0, ea, eb
	}
	// Different slots: one transaction.
	sent, ea, eb := sendTwo(
		[]location.Op{location.TakeSlotOp(nk, lease.ID, 100, holder(100), true)},
		[]location.Op{location.TakeSlotOp(nk, lease.ID, 101, holder(101), true)})
	require.NoError(t, ea)
	require.NoError(t, eb)
	require.EqualValues(t, 1, sent, "Applies of different slots share a transaction")
	// One slot, freed by one and taken by the other: two transactions,
	// in queue order, so the take finds the slot free.
	sent, ea, eb = sendTwo(
		[]location.Op{location.FreeSlotOp(nk, 100)},
		[]location.Op{location.TakeSlotOp(nk, lease.ID, 100, holder(102), false)})
	require.NoError(t, ea)
	require.NoError(t, eb)
	require.EqualValues(t, 2, sent, "Applies of one slot never share a transaction")
	// One slot taken by both: two transactions, the second conflicts.
	sent, ea, eb = sendTwo(
		[]location.Op{location.TakeSlotOp(nk, lease.ID, 102, holder(103), false)},
		[]location.Op{location.CreateOp(holder(104), batchRecord(1)), location.TakeSlotOp(nk, lease.ID, 102, holder(104), false)})
	require.NoError(t, ea)
	c := new(location.ConflictError)
	require.True(t, errors.As(eb, &c), "%v", eb)
	require.Equal(t, []int{1}, c.FailedOps)
	require.EqualValues(t, 2, sent)
	_, err = s.Read(ctx, holder(104))
	require.ErrorIs(t, err, location.ErrNotFound)

	slots, err = s.ListSlots(ctx, nk)
	require.NoError(t, err)
	require.Equal(t, []location.Slot{
		{Index: 100, Holder: holder(102)},
		{Index: 101, Holder: holder(101), Pending: true},
		{Index: 102, Holder: holder(103)},
	}, slots[n:])
}
