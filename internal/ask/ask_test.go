package ask_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
)

// A question takes only its answer: what Accept refuses is counted and
// the question waits on; a dead letter ends it as a Proto.Actor future's
// would; with no answer it times out; its route is gone after it.
func TestAQuestionTakesOnlyItsAnswer(t *testing.T) {
	sys := actor.NewActorSystem()
	routes := make(chan *actor.PID, 1)
	asked, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*wrapperspb.StringValue); ok {
			routes <- c.Sender()
		}
	}), "asked")
	require.NoError(t, err)
	want := func(m any) bool { s, ok := m.(*wrapperspb.StringValue); return ok && s.Value == "yes" }
	done := make(chan any, 1)
	go func() {
		r, err := ask.Ask(context.Background(), sys, asked, wrapperspb.String("?"), time.Minute, ask.Question{What: "t", Accept: want})
		require.NoError(t, err)
		done <- r
	}()
	route := <-routes
	require.True(t, ask.IsRoute(route.Id))
	before := ask.Refused()
	sys.Root.Send(route, wrapperspb.String("no"))
	require.Equal(t, before+1, ask.Refused(), "a local send is judged at once")
	sys.Root.Send(route, wrapperspb.String("yes"))
	require.Equal(t, "yes", (<-done).(*wrapperspb.StringValue).Value)
	_, _, waiting := ask.Expected(route.Id)
	require.False(t, waiting)

	_, err = ask.Ask(context.Background(), sys, actor.NewPID(sys.Address(), "nobody"), wrapperspb.String("?"), time.Minute, ask.Question{Accept: want})
	require.ErrorIs(t, err, actor.ErrDeadLetter)
	_, err = ask.Ask(context.Background(), sys, asked, wrapperspb.String("?"), time.Millisecond, ask.Question{Accept: want})
	require.ErrorIs(t, err, actor.ErrTimeout)
	<-routes
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ask.Ask(ctx, sys, asked, wrapperspb.String("?"), time.Minute, ask.Question{Accept: want})
	require.ErrorIs(t, err, context.Canceled)
}

func TestTokensDoNotRepeat(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		tok := ask.Token()
		require.Len(t, tok, 32)
		require.False(t, seen[tok])
		seen[tok] = true
	}
}

// A question's timeout runs on the asking node's clock: under a logical
// clock it ends when that clock passes it, however long real time waits.
func TestAQuestionTimesOutOnTheAskersClock(t *testing.T) {
	sys := actor.NewActorSystem()
	asked, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "silent")
	require.NoError(t, err)
	clock := machine.NewManual()
	done := make(chan error, 1)
	go func() {
		_, err := ask.Ask(context.Background(), sys, asked, wrapperspb.String("?"), time.Hour, ask.Question{What: "t", Clock: clock})
		done <- err
	}()
	testwait.Within(t, 10*time.Second, func() bool { return clock.Armed() == 1 }, "the question's timer armed on the manual clock")
	select {
	case err := <-done:
		t.Fatalf("the question ended before its clock passed the timeout: %v", err)
	default:
	}
	clock.Advance(time.Hour)
	select {
	case err := <-done:
		require.ErrorIs(t, err, actor.ErrTimeout)
	case <-time.After(10 * time.Second):
		t.Fatal("the question did not time out when its clock passed the timeout")
	}
}
