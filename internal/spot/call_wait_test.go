package spot_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/roamerr"
)

// mute is an Instance Spot that answers nothing: it reports each request
// it gets and keeps it.
type mute struct{ got chan<- string }

func (m *mute) Receive(c actor.Context) {
	if s, ok := c.Message().(*wrapperspb.StringValue); ok {
		m.got <- s.Value
	}
}

// A request's wait ends at its deadline on the node's clock, not before,
// and at once when its caller cancels; and a caller's own earlier deadline
// bounds it. A call on a cached route waits on a timer of its own and its
// caller's Done rather than on a context derived for every call (callCtx),
// so each way out is checked here, with the route cached.
// Reference: docs/PROTOCOL.md §7.4.
func TestARequestsWaitEndsAtItsDeadlineOrWhenItsCallerCancels(t *testing.T) {
	w := newLogicalWorld(t)
	got := make(chan string, 8)
	kind := extension.Kind{StableType: "mute", Instance: true, Policy: extension.RecreateOnRelocation(),
		Producer: func() actor.Actor { return &mute{got: got} }}
	caller, owner := w.start(), w.start(withKinds(kind))
	_, err := owner.SpawnInstanceSpot(ctx, "mute", "quiet")
	require.NoError(t, err)
	call := func(c context.Context, value string, timeout time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := caller.Spots().Request("quiet", wrapperspb.String(value)).Timeout(timeout).Do(c)
			done <- err
		}()
		return done
	}
	handled := func(value string) {
		t.Helper()
		select {
		case v := <-got:
			require.Equal(t, value, v)
		case <-time.After(testwait.Patience(t)):
			t.Fatalf("the Spot did not get %q", value)
		}
	}
	ended := func(done <-chan error, what string) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(testwait.Patience(t)):
			t.Fatalf("the call did not end: %s", what)
			return nil
		}
	}

	// Its own deadline: not over with a second left, over once it passed.
	done := call(ctx, "timeout", 5*time.Second)
	handled("timeout")
	w.advance(t, 4*time.Second)
	select {
	case err := <-done:
		t.Fatalf("the call ended with a second of its deadline left: %v", err)
	default:
	}
	w.advance(t, 2*time.Second)
	err = ended(done, "its deadline passed")
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.Contains(t, err.Error(), "no reply")

	// Its caller's own deadline, earlier than its own: over at that one.
	pctx, pcancel := machine.WithTimeout(ctx, w.clock, 2*time.Second)
	defer pcancel()
	done = call(pctx, "bounded", time.Minute)
	handled("bounded")
	w.advance(t, 3*time.Second)
	err = ended(done, "its caller's deadline passed")
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)

	// Its caller cancels: over at once, with the caller's error.
	cctx, cancel := context.WithCancel(ctx)
	done = call(cctx, "cancelled", time.Minute)
	handled("cancelled")
	cancel()
	err = ended(done, "its caller cancelled")
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.True(t, errors.Is(err, context.Canceled), "the caller's cancellation is the cause: %v", err)
}
