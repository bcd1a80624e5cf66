package relocation_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/actor/middleware/propagator"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
)

// Every incarnation of a kind spawns from one shared Props and finds its
// object inside the spawn. roam spawns with Proto.Actor's default spawner:
// a spawner of the kind's Props (one that answers a PID and spawns later,
// or elsewhere — where it would find another object spawning) is never
// used, and the incarnation serves as any other.
func TestAKindsOwnSpawnerIsNotUsed(t *testing.T) {
	var called atomic.Int32
	later := func(sys *actor.ActorSystem, id string, _ *actor.Props, _ actor.SpawnerContext) (*actor.PID, error) {
		called.Add(1)
		return sys.NewLocalPID(id), nil
	}
	kind := relocation.Kind{StableType: "later", Props: actor.PropsFromProducer(func() actor.Actor { return &counter{} }, actor.WithSpawnFunc(later)),
		Policy: relocation.RecreateOnRelocation()}
	n := startNodeWith(t, newStore(t), kind)
	sys := n.node.System()

	pid, err := n.driver.SpawnInstanceSpot(context.Background(), "later", "l-1")
	require.NoError(t, err)
	sys.Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, sys, pid))
	require.Zero(t, called.Load(), "the kind's own spawner never ran")
}

// Spawn middleware of the actor system's root context does not touch
// incarnations. Proto.Actor's middleware propagator (tracing is built on
// it) configures the Props it is given in place: through the root context,
// each incarnation's spawn would add its middleware to the kind's shared
// Props once more — the Nth incarnation running it N times a message, and
// the driver rewriting Props that running incarnations read. Middleware
// for incarnations belongs on the kind's Props.
func TestRootSpawnMiddlewareDoesNotTouchIncarnations(t *testing.T) {
	var onKind, onRoot atomic.Int32
	counting := func(seen *atomic.Int32) actor.ReceiverMiddleware {
		return func(next actor.ReceiverFunc) actor.ReceiverFunc {
			return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
				if v, ok := env.Message.(*wrapperspb.Int64Value); ok && v.Value == 1 {
					seen.Add(1)
				}
				next(c, env)
			}
		}
	}
	kind := relocation.Kind{StableType: "traced", Props: actor.PropsFromProducer(func() actor.Actor { return &counter{} },
		actor.WithReceiverMiddleware(counting(&onKind))), Policy: relocation.RecreateOnRelocation()}
	n := startNodeWith(t, newStore(t), kind)
	sys := n.node.System()
	// As an application enables tracing or logging for all its actors.
	sys.Root.WithSpawnMiddleware(propagator.New().WithReceiverMiddleware(counting(&onRoot)).SpawnMiddleware)

	ctx := context.Background()
	var last *actor.PID
	for i := range 5 {
		pid, err := n.driver.SpawnInstanceSpot(ctx, "traced", fmt.Sprintf("t-%d", i))
		require.NoError(t, err)
		last = pid
	}
	sys.Root.Send(last, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, sys, last))
	require.Equal(t, int32(1), onKind.Load(), "the kind's own middleware runs once a message")
	require.Zero(t, onRoot.Load(), "the root context's spawn middleware is not applied to incarnations")
}

// stackRecorder answers a request with whether its turn runs on a pooled
// goroutine (machine.Go's worker) or on one of a dispatcher's own.
type stackRecorder struct{}

func (stackRecorder) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.StringValue); ok {
		buf := make([]byte, 64<<10)
		buf = buf[:runtime.Stack(buf, false)]
		c.Respond(wrapperspb.Bool(strings.Contains(string(buf), "roam/internal/machine.(*worker).loop(")))
	}
}

// A kind's incarnations run their turns on pooled goroutines, which keep
// the stacks they grew, when its Props name no dispatcher (Proto.Actor's
// default starts a goroutine for every run of the mailbox); a dispatcher
// the Props name is kept.
func TestAKindRunsOnPooledGoroutinesUnlessItsPropsNameADispatcher(t *testing.T) {
	plain := relocation.Kind{StableType: "plain", Props: actor.PropsFromProducer(func() actor.Actor { return stackRecorder{} }),
		Policy: relocation.RecreateOnRelocation()}
	own := relocation.Kind{StableType: "own", Props: actor.PropsFromProducer(func() actor.Actor { return stackRecorder{} },
		actor.WithDispatcher(actor.NewDefaultDispatcher(300))), Policy: relocation.RecreateOnRelocation()}
	n := startNodeWith(t, newStore(t), plain, own)
	sys := n.node.System()
	pooled := func(kind string) bool {
		pid, err := n.driver.SpawnInstanceSpot(context.Background(), kind, kind+"-1")
		require.NoError(t, err)
		reply, err := sys.Root.RequestFuture(pid, wrapperspb.String("where?"), testwait.Patience(t)).Result()
		require.NoError(t, err)
		return reply.(*wrapperspb.BoolValue).GetValue()
	}
	require.True(t, pooled("plain"), "Props without a dispatcher: pooled goroutines")
	require.False(t, pooled("own"), "Props with their own dispatcher keep it")
}
