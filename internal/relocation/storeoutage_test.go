package relocation_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// keyOutage answers every call on one object's record Unavailable while
// down is set (the object's own Consul key, or the whole KV, unreachable;
// node descriptors and leases still work).
type keyOutage struct {
	location.Store
	key  location.AuthorityKey
	down atomic.Bool
}

func (s *keyOutage) hit(key location.AuthorityKey) bool { return key == s.key && s.down.Load() }

func (s *keyOutage) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if s.hit(key) {
		return location.Versioned{}, location.ErrUnavailable
	}
	return s.Store.Read(ctx, key)
}

func (s *keyOutage) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	if s.hit(key) {
		return 0, location.ErrUnavailable
	}
	return s.Store.CompareAndSet(ctx, key, expected, rec)
}

func (s *keyOutage) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if s.hit(op.Key) {
			return nil, location.ErrUnavailable
		}
	}
	return s.Store.Apply(ctx, ops)
}

func (s *keyOutage) Watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) (location.Versioned, error) {
	if s.hit(key) {
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		return location.Versioned{}, location.ErrUnavailable
	}
	return s.Store.Watch(ctx, key, after)
}

// outageNodes are two nodes (restore timeout restore) on a store whose
// answers for one Actor's record ("outage") stop while st.down is set.
func outageNodes(t *testing.T, restore time.Duration) (st *keyOutage, a, b *testNode) {
	st = &keyOutage{Store: newStore(t), key: location.Key(location.KindActor, "outage")}
	t.Cleanup(func() { st.down.Store(false) })
	cfg := relocation.Config{Logger: testLogger(), RestoreTimeout: restore}
	return st, startNodeConfig(t, st, cfg, counterKind), startNodeConfig(t, st, cfg, counterKind)
}

// A store that stops answering for an object's record as a move's target
// is about to check the source (here: until the test ends) does not keep
// the object unserved, nor seal it: the check says nothing of the source
// until halfway to the restore deadline, the move ends Unavailable before
// its seal, and the object answers throughout.
// Reference: docs/PROTOCOL.md §5.2; docs/FAULTS.md.
func TestAStoreOutageAtTheSourceCheckEndsTheMoveUnsealed(t *testing.T) {
	// The target answers halfway to the restore deadline, the source gives
	// up at it: 3 s between the two, so that a machine busy enough to
	// starve the nodes for a second (four CPU-bound processes beside the
	// race detector: it failed so at 2 s) still sees the target's answer.
	st, a, b := outageNodes(t, 6*time.Second)
	key := st.key
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	relocation.DropInbound(b.driver, func(m any) bool {
		if _, ok := m.(*messages.SourceCheck); ok {
			st.down.Store(true)
		}
		return false
	})
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	testwait.For(t, st.down.Load, "the target never got the source check")
	for n := int64(1); ; n++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(n))
		require.Equal(t, n, get(t, a.node.System(), pid), "the object answers while its move waits for the check")
		select {
		case err := <-moved:
			require.ErrorIs(t, err, roamerr.ErrUnavailable)
			require.False(t, relocation.Arriving(b.driver, key), "nothing was prepared on the target")
			return
		default:
		}
	}
}

// A store that stops answering for an object's record just after a move
// sealed it (here: until the test ends) does not keep the object unserved
// when the target checks the source after the Restore request (a target
// without the check before the seal): it cannot check the source, the
// move fails before relay-ready at its restore deadline, and the source
// serves again — while the store is still out. A target that answered
// relay-ready without the store would leave the object waiting for the
// store to come back; with the check before the seal, that is what a
// store outage that begins between the check and the commit does (as one
// that begins between VerifySource's read and the commit always did):
// docs/FAULTS.md.
// Reference: docs/PROTOCOL.md §5.7, §6.2; docs/FAULTS.md.
func TestAStoreOutageAtTheSealEndsTheMoveAtItsRestoreDeadline(t *testing.T) {
	st, a, b := outageNodes(t, 2*time.Second)
	key := st.key
	relocation.WithoutSourceCheck(b.driver)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))

	prepared := make(chan struct{})
	var once sync.Once
	relocation.DropInbound(b.driver, func(m any) bool {
		if _, ok := m.(*messages.RelocationPrepare); ok {
			once.Do(func() {
				st.down.Store(true)
				close(prepared)
			})
		}
		return false
	})
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	<-prepared
	// Held by the sealed source until the move ends: answered then, or
	// failed loudly if the source's own deadline came first and it started
	// reconciling (PROTOCOL.md §6.4) before the target's failure arrived.
	res, err := a.node.System().Root.RequestFuture(pid, wrapperspb.String("get"), time.Minute).Result()
	require.NoError(t, err)
	if derr := relocation.DeliveryError(res); derr != nil {
		require.ErrorIs(t, derr, roamerr.ErrUnavailable)
	} else {
		require.Equal(t, int64(1), res.(*wrapperspb.Int64Value).Value)
	}
	require.Error(t, <-moved)
	// The source serves again, the store still out: once the target's
	// explicit failure has reached it, also when it was reconciling.
	testwait.For(t, func() bool {
		res, err := a.node.System().Root.RequestFuture(pid, wrapperspb.String("get"), time.Minute).Result()
		return err == nil && relocation.DeliveryError(res) == nil && res.(*wrapperspb.Int64Value).Value == 1
	}, "the source never served again during the outage")
	require.True(t, st.down.Load(), "served again while the store is still out")
}
