package sessionhost_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// A bound Actor whose node crashes is not written off by its Session: a
// client message sent after the crash is not sent into the lost
// connection (and reported sent) but held, while a live node recovers the
// Actor from its last checkpoint; the recovering node tells the Session
// owner, which checks the route in the store and sends the held message
// there, after the state the checkpoint kept. The Session stays open.
// Reference: docs/SESSIONS.md §5, docs/FAULTS.md "Checkpoints and recovery".
func TestHeldWhileTheBoundActorIsRecoveredAfterItsNodeCrashed(t *testing.T) {
	// stopped: b stops without a drain (its descriptor goes at once);
	// killed: b is cut off from the store and its connections end, its
	// descriptor staying until its lease is revoked — the Session must not
	// take it for alive and release into the lost connection.
	for _, crash := range []string{"stopped", "killed"} {
		t.Run(crash, func(t *testing.T) { heldWhileRecovered(t, crash) })
	}
}

func heldWhileRecovered(t *testing.T, crash string) {
	ctx := context.Background()
	mem, logs := memstore.New(), &logBuffer{}
	cut, err := faulty.New(mem, faulty.Config{})
	require.NoError(t, err)
	g := &gate{}
	kind := roam.NewKind("journal", actor.PropsFromProducer(func() actor.Actor { return &journal{g: g, fail: &sync.Map{}} }), roam.PreserveState(),
		roam.CheckpointEvery(1))
	var shutdowns []*sync.Once
	node := func(name string) (*roam.Roam, *actor.ActorSystem) {
		system := actor.NewActorSystem()
		var store location.Store = mem
		if name == "b" {
			store = cut
		}
		r, err := roam.New(system, roam.WithStore(store), roam.WithKinds(kind), roam.WithNodeName(name), roam.WithDrainOnStop(false),
			roam.WithLogger(zerolog.New(logs)), roam.WithLeaseTTL(2*time.Second))
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		var once sync.Once
		t.Cleanup(func() {
			_ = r.Stop(context.Background())
			once.Do(system.Shutdown)
		})
		shutdowns = append(shutdowns, &once)
		return r, system
	}
	gw, _ := node("gw")
	b, bSystem := node("b")
	recovered := make(chan string, 1)
	s, err := gw.OpenSession(roam.SessionOptions{OnRecovered: func(id string) { recovered <- id }})
	require.NoError(t, err)
	_, err = s.SpawnActor(ctx, "journal", "alice")
	require.NoError(t, err)
	_, err = gw.Relocate(ctx, roam.ActorRef("alice"), "b")
	require.NoError(t, err)
	require.NoError(t, s.Send("alice", wrapperspb.String("before")))
	require.Equal(t, "bound,before", journalOf(t, s))
	// The checkpoint is written off the dispatch path: a crash before it
	// lands would lose "before" by design.
	testwait.For(t, func() bool {
		data, _, err := mem.GetCheckpoint(ctx, roam.ActorRef("alice"))
		return err == nil && bytes.Contains(data, []byte("before"))
	}, "alice's checkpoint after \"before\" in the store")

	// b crashes: no drain, and its connections end with its actor system.
	if crash == "stopped" {
		require.NoError(t, b.Stop(ctx))
	} else {
		cut.Partition(true)
		remote.GetRemote(bSystem).Shutdown(false) // its connections end
	}
	shutdowns[1].Do(bSystem.Shutdown)
	testwait.For(t, func() bool {
		return s.Send("alice", wrapperspb.String("after")) == nil && sessionhost.Unwrap(s).Held("alice") > 0
	}, "a message after the crash is held, not sent into the lost connection")
	require.True(t, logs.has("session_route_down"))

	testwait.For(t, func() bool { return !sessionhost.Unwrap(s).Sealed("alice") }, "alice recovered and the held message released")
	require.True(t, logs.has("object_recovered"))
	pid, err := gw.Resolve(ctx, roam.ActorRef("alice"))
	require.NoError(t, err)
	require.Equal(t, gw.System().Address(), pid.Address, "recovered on the live node")
	require.Equal(t, "bound,before,after", journalOf(t, s), "from the checkpoint, then the held message")
	select {
	case id := <-recovered:
		require.Equal(t, "alice", id, "the client is told its Actor came back from a checkpoint")
	case <-time.After(testwait.Patience(t)):
		t.Fatal("OnRecovered was never called")
	}
	require.NoError(t, s.Err())
}
