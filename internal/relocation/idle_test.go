package relocation_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// holder is a counter whose turn for the string "hold" waits until
// release is closed; "timer" registers a one-shot timer due in an hour.
type holder struct {
	counter
	*turnGate
}

type turnGate struct{ entered, release chan struct{} }

// holderState carries the holder's counter.
type holderState struct{}

func (holderState) Capture(a actor.Actor) ([]byte, error) {
	return counterState{}.Capture(&a.(*holder).counter)
}

func (holderState) Restore(a actor.Actor, b []byte) error {
	return counterState{}.Restore(&a.(*holder).counter, b)
}

func (h *holder) Receive(ctx actor.Context) {
	if s, ok := ctx.Message().(*wrapperspb.StringValue); ok {
		switch s.Value {
		case "hold":
			close(h.entered)
			<-h.release
			return
		case "timer":
			ts, err := relocation.Timers(ctx)
			if err == nil {
				err = ts.After("soon", time.Hour)
			}
			if err != nil {
				panic(err)
			}
			ctx.Respond(wrapperspb.String("armed"))
			return
		}
	}
	h.counter.Receive(ctx)
}

func holderKind(g *turnGate) relocation.Kind {
	return relocation.Kind{StableType: "holder", Producer: func() actor.Actor { return &holder{turnGate: g} }, Policy: relocation.PreserveStateWith(holderState{})}
}

// holderOnA starts two nodes hosting holders and spawns the holder id on
// the first.
func holderOnA(t *testing.T, id string) (store location.Store, a, b *testNode, g *turnGate, key location.AuthorityKey, pid *actor.PID) {
	t.Helper()
	g = &turnGate{entered: make(chan struct{}), release: make(chan struct{})}
	store = newStore(t)
	a = startNodeWith(t, store, holderKind(g))
	b = startNodeWith(t, store, holderKind(g))
	key = location.Key(location.KindActor, id)
	pid, err := a.driver.Spawn(context.Background(), "holder", key.ID)
	require.NoError(t, err)
	return store, a, b, g, key, pid
}

func ownerRid(t *testing.T, store location.Store, key location.AuthorityKey) string {
	t.Helper()
	v, err := store.Read(context.Background(), key)
	require.NoError(t, err)
	return v.Record.GetOwner().GetNodeRid()
}

// An idle object moves with RelocateIfIdle as with Relocate.
// Reference: docs/PLACEMENT.md §3 (idle-only admission).
func TestRelocateIfIdleMovesAnIdleObject(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	key := location.Key(location.KindActor, "idle")
	pid, err := c.nodes[0].driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	sys := c.nodes[0].node.System()
	sys.Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, sys, pid))
	out, err := c.nodes[0].driver.RelocateIfIdle(ctx, key, c.rid(1), time.Second)
	require.NoError(t, err)
	require.Equal(t, c.rid(1), out.To)
	require.Equal(t, c.rid(1), ownerRid(t, c.store, key))
	require.Equal(t, int64(1), get(t, sys, pid), "the state moved")
}

// A busy object is not moved: with messages queued behind a long turn the
// move is refused before anything is asked of the target; with the queue
// filling while the move waits for the turn, the seal finds it busy and
// undoes itself. Either way the error is Unavailable with ErrBusy, the
// record still names the source, and every message is handled once, in
// order, where it was.
func TestRelocateIfIdleRefusesABusyObject(t *testing.T) {
	for _, atSeal := range []bool{false, true} {
		name := map[bool]string{false: "queued before", true: "queued during the seal's wait"}[atSeal]
		t.Run(name, func(t *testing.T) {
			store, a, b, h, key, pid := holderOnA(t, "busy")
			ctx := context.Background()
			sys := a.node.System()
			sys.Root.Send(pid, wrapperspb.String("hold"))
			<-h.entered
			var once sync.Once
			release := func() { once.Do(func() { close(h.release) }) }
			defer release()
			send := func() {
				for i := int64(1); i <= 5; i++ {
					sys.Root.Send(pid, wrapperspb.Int64(i))
				}
			}
			var err error
			if atSeal {
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, err = a.driver.RelocateIfIdle(ctx, key, b.node.Descriptor().GetNodeRid(), time.Second)
				}()
				require.Eventually(t, func() bool { return relocation.Leaving(a.driver, key) }, testwait.Patience(t), time.Millisecond,
					"the move reaches its seal, which waits for the turn")
				send()
				release()
				<-done
			} else {
				send()
				_, err = a.driver.RelocateIfIdle(ctx, key, b.node.Descriptor().GetNodeRid(), time.Second)
				release()
			}
			require.Error(t, err)
			require.True(t, errors.Is(err, roamerr.ErrBusy), "want ErrBusy, got %v", err)
			roamerrtest.AssertOneClass(t, err, roamerr.ErrBusy)
			require.Equal(t, a.node.Descriptor().GetNodeRid(), ownerRid(t, store, key), "nothing moved")
			waitCount(t, sys, pid, 5)
		})
	}
}

// A timer due within the window makes the object busy; with a window
// shorter than the timer's delay it moves, and the timer with it.
func TestRelocateIfIdleCountsATimerDueSoonAsBusy(t *testing.T) {
	store, a, b, _, key, pid := holderOnA(t, "timed")
	ctx := context.Background()
	sys := a.node.System()
	res, err := sys.Root.RequestFuture(pid, wrapperspb.String("timer"), 10*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, "armed", res.(*wrapperspb.StringValue).Value)
	_, err = a.driver.RelocateIfIdle(ctx, key, b.node.Descriptor().GetNodeRid(), 2*time.Hour)
	roamerrtest.AssertOneClass(t, err, roamerr.ErrBusy)
	require.Contains(t, err.Error(), `timer "soon"`)
	require.Equal(t, a.node.Descriptor().GetNodeRid(), ownerRid(t, store, key))
	_, err = a.driver.RelocateIfIdle(ctx, key, b.node.Descriptor().GetNodeRid(), time.Minute)
	require.NoError(t, err)
	require.Equal(t, b.node.Descriptor().GetNodeRid(), ownerRid(t, store, key))
}
