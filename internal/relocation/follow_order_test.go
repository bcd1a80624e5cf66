package relocation_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// A message past the follow hop limit leaves its route for the store's
// owner record, but not ahead of what its incarnation forwarded before it.
// One caller's messages reach the hop limit at different incarnations (the
// saved work and the relay of a move count no hop): here two sends still
// follow through node B, held there, when the caller's request behind them
// reaches the limit at A, and the store names an incarnation on A itself.
// The request is handled after both sends: its reply counts them.
// Reference: docs/PROTOCOL.md §5.14 (hops; the store; order per sender).
func TestFollowPastTheLimitDoesNotOvertakeEarlierSends(t *testing.T) {
	store := newStore(t)
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce, releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	// B's Message Follow stalls after forwarding the first send, under the
	// incarnation's mailbox lock: what A sent B after it waits at B, in
	// order, as on a slow or busy node.
	holdB := relocation.Config{Logger: testLogger(), OnFollow: func(_ location.AuthorityKey, env *actor.MessageEnvelope) {
		if v, ok := env.Message.(*wrapperspb.Int64Value); ok && v.GetValue() == 1 {
			holdOnce.Do(func() {
				close(held)
				<-release
			})
		}
	}}
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, counterKind)
	b := startNodeConfig(t, store, holdB, counterKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "order")
	first, err := a.driver.Spawn(ctx, "counter", "order")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	_, err = b.driver.Relocate(ctx, key, a.node.Descriptor().GetNodeRid())
	require.NoError(t, err)

	sys := a.node.System()
	sys.Root.Send(first, wrapperspb.Int64(1)) // A → B → A
	sys.Root.Send(first, wrapperspb.Int64(2))
	<-held
	// The caller's request behind them has used its hops (as on a route
	// followed through many moves): its first hop at A passes the limit.
	f := actor.NewFuture(sys, time.Hour)
	env := &actor.MessageEnvelope{Message: wrapperspb.String("get"), Sender: f.PID()}
	env.SetHeader(relocation.HeaderHops, "8")
	sys.Root.Send(first, env)
	type result struct {
		res any
		err error
	}
	answer := make(chan result, 1)
	var answered atomic.Bool
	go func() { // the future's only waiter
		res, err := f.Result()
		answered.Store(true)
		answer <- result{res, err}
	}()
	// Either the request went ahead (the defect), or A waits for what it
	// forwarded to B to arrive first.
	testwait.For(t, func() bool { return answered.Load() || relocation.Draining(a.driver) > 0 },
		"the request past the hop limit was neither delivered nor held behind the earlier sends")
	unblock()
	got := <-answer
	require.NoError(t, got.err)
	require.NoError(t, relocation.DeliveryError(got.res))
	require.Equal(t, int64(2), got.res.(*wrapperspb.Int64Value).GetValue(), "the request is handled after both earlier sends, in order")
}
