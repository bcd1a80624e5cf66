package roam_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// sitter counts its numbered sends, answers "get" with the count, and
// holds its turn for "hold" until its gate opens.
type sitter struct {
	g     *sitGate
	count int64
}

type sitGate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *sitGate) open() { g.once.Do(func() { close(g.release) }) }

func (s *sitter) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.Int64Value:
		s.count++
	case *wrapperspb.StringValue:
		switch m.Value {
		case "hold":
			close(s.g.entered)
			<-s.g.release
		case "get":
			c.Respond(wrapperspb.Int64(s.count))
		}
	}
}

func (s *sitter) CaptureState() ([]byte, error) {
	return []byte{byte(s.count)}, nil
}

func (s *sitter) RestoreState(b []byte) error {
	s.count = int64(b[0])
	return nil
}

// RelocateIfIdle, asked on a node that does not own the Actor: the owner
// refuses while the Actor is busy (a long turn with messages queued
// behind it) with ErrBusy across the wire, and nothing moves; once it is
// idle the same call moves it with its state. On memstore and Consul.
// Reference: docs/PLACEMENT.md §3 (idle-only admission).
func TestRelocateIfIdleFromAnotherNode(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		g := &sitGate{entered: make(chan struct{}), release: make(chan struct{})}
		kind := roam.NewKind("sitter", actor.PropsFromProducer(func() actor.Actor { return &sitter{g: g} }), roam.PreserveState())
		a := start(t, store, roam.WithNodeName("a"), roam.WithKinds(kind))
		start(t, store, roam.WithNodeName("b"), roam.WithKinds(kind))
		c := start(t, store, roam.WithNodeName("c"), roam.WithKinds(kind))
		defer g.open()
		pid, err := a.SpawnActor(ctx, "sitter", "sit")
		require.NoError(t, err)
		ref := roam.ActorRef("sit")
		a.System().Root.Send(pid, wrapperspb.String("hold"))
		testwait.Recv(t, g.entered, "the sitter entered its turn")
		for i := int64(1); i <= 3; i++ {
			a.System().Root.Send(pid, wrapperspb.Int64(i))
		}
		_, err = c.RelocateIfIdle(ctx, ref, "b", time.Second)
		roamerrtest.AssertOneClass(t, err, roamerr.ErrBusy)
		now, err := c.Resolve(ctx, ref)
		require.NoError(t, err)
		require.Equal(t, a.System().Address(), now.Address, "a busy Actor is not moved")

		g.open()
		testwait.For(t, func() bool {
			res, err := a.System().Root.RequestFuture(pid, wrapperspb.String("get"), 5*time.Second).Result()
			return err == nil && res.(*wrapperspb.Int64Value).GetValue() == 3
		}, "the queued sends are handled where they were")
		out, err := c.RelocateIfIdle(ctx, ref, "b", time.Second)
		require.NoError(t, err)
		require.NotZero(t, out.RelocationID)
		now, err = c.Resolve(ctx, ref)
		require.NoError(t, err)
		res, err := c.System().Root.RequestFuture(now, wrapperspb.String("get"), 5*time.Second).Result()
		require.NoError(t, err)
		require.EqualValues(t, 3, res.(*wrapperspb.Int64Value).GetValue(), "its state moved")
	})
}
