package relocation_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// keyReads counts one node's reads of one key.
type keyReads struct {
	location.Store
	key   location.AuthorityKey
	reads atomic.Int64
}

func (s *keyReads) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key == s.key {
		s.reads.Add(1)
	}
	return s.Store.Read(ctx, key)
}

// preparesOf keeps the Restore requests a node receives; at each arrival
// it calls onArrival, if set.
func preparesOf(n *testNode, onArrival func()) func() []*messages.RelocationPrepare {
	var mu sync.Mutex
	var got []*messages.RelocationPrepare
	relocation.DropInbound(n.driver, func(m any) bool {
		if p, ok := m.(*messages.RelocationPrepare); ok {
			mu.Lock()
			got = append(got, proto.Clone(p).(*messages.RelocationPrepare))
			mu.Unlock()
			if onArrival != nil {
				onArrival()
			}
		}
		return false
	})
	return func() []*messages.RelocationPrepare {
		mu.Lock()
		defer mu.Unlock()
		return append([]*messages.RelocationPrepare(nil), got...)
	}
}

// The Restore request carries the object's record as the source read it
// before the seal, and the target takes it for its source check: the
// target reads nothing between the prepare and its commit, either way.
// Reference: docs/PROTOCOL.md §5.3, §5.7, §5.11.
func TestTheTargetChecksItsSourceByTheRecordThePrepareCarries(t *testing.T) {
	shared := newStore(t)
	key := location.Key(location.KindActor, "checked")
	ra, rb := &keyReads{Store: shared, key: key}, &keyReads{Store: shared, key: key}
	a, b := startNodeWith(t, ra, counterKind), startNodeWith(t, rb, counterKind)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	for i := int64(1); i <= 5; i++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(i))
	}
	move := func(from, to *testNode, sourceReads, targetReads *keyReads) {
		t.Helper()
		var readsAtPrepare atomic.Int64
		prepares := preparesOf(to, func() { readsAtPrepare.Store(sourceReads.reads.Load()) })
		before, err := shared.Read(ctx, key)
		require.NoError(t, err)
		sourceBefore, targetBefore := sourceReads.reads.Load(), targetReads.reads.Load()
		_, err = from.driver.Relocate(ctx, key, to.node.Descriptor().GetNodeRid())
		require.NoError(t, err)
		require.Equal(t, targetBefore, targetReads.reads.Load(), "the target read the record")
		require.Equal(t, sourceBefore+1, readsAtPrepare.Load(), "the source reads once before the seal")
		p := prepares()
		require.Len(t, p, 1)
		require.Equal(t, uint64(before.Version), p[0].GetSourceRecordVersion())
		require.True(t, proto.Equal(before.Record, p[0].GetSourceRecord()), "the record as the store held it")
		now, err := shared.Read(ctx, key)
		require.NoError(t, err)
		require.Equal(t, to.node.Descriptor().GetNodeRid(), now.Record.GetOwner().GetNodeRid())
	}
	move(a, b, ra, rb)
	move(b, a, rb, ra)
	require.Equal(t, int64(5), get(t, a.node.System(), pid))
}

// bumpOnFirstCommit writes the record again, unchanged, just before the
// target's first compare-and-set on key: a write after the source's read
// (as a Join's member count is, by another node).
type bumpOnFirstCommit struct {
	location.Store
	key    location.AuthorityKey
	once   sync.Once
	bumped atomic.Bool
	reads  atomic.Int64 // reads of key after the bump
}

func (s *bumpOnFirstCommit) bump(ctx context.Context, key location.AuthorityKey) {
	if key != s.key {
		return
	}
	s.once.Do(func() {
		if v, err := s.Store.Read(ctx, key); err == nil {
			if _, err := s.Store.CompareAndSet(ctx, key, v.Version, v.Record); err == nil {
				s.bumped.Store(true)
			}
		}
	})
}

func (s *bumpOnFirstCommit) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	s.bump(ctx, key)
	return s.Store.CompareAndSet(ctx, key, expected, rec)
}

func (s *bumpOnFirstCommit) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if op.Kind == location.OpUpdate {
			s.bump(ctx, op.Key)
		}
	}
	return s.Store.Apply(ctx, ops)
}

func (s *bumpOnFirstCommit) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key == s.key && s.bumped.Load() {
		s.reads.Add(1)
	}
	return s.Store.Read(ctx, key)
}

// A record written between the source's read and the target's commit
// makes the record the prepare carried old: the commit conflicts, reads,
// finds the record still at the move's fence and commits. The move
// succeeds with nothing lost.
// Reference: docs/PROTOCOL.md §5.7, §5.11 (conflict, still at the fence).
func TestAnOldSourceRecordCostsAReadNotTheMove(t *testing.T) {
	shared := newStore(t)
	key := location.Key(location.KindActor, "old-record")
	target := &bumpOnFirstCommit{Store: shared, key: key}
	a, b := startNodeWith(t, shared, counterKind), startNodeWith(t, target, counterKind)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	const total = 500
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := int64(1); i <= total; i++ {
			a.node.System().Root.Send(pid, wrapperspb.Int64(i))
		}
	}()
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	<-sent
	require.True(t, target.bumped.Load(), "the record was written between the source's read and the commit")
	require.Positive(t, target.reads.Load(), "the commit's conflict made the target read")
	now, err := shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, b.node.Descriptor().GetNodeRid(), now.Record.GetOwner().GetNodeRid())
	require.Equal(t, int64(total), get(t, a.node.System(), pid), "every send handled once, in order")
}
