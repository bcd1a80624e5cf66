package roam_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// Every value out of range is refused by New, where it is given, with the
// valid range in the message — not accepted and failed later at Start.
func TestNewRefusesValuesOutOfRange(t *testing.T) {
	store := memstore.New()
	cases := []struct {
		name string
		opt  roam.Option
		want string // part of the message
	}{
		{"negative lease TTL", roam.WithLeaseTTL(-time.Second), "whole seconds"},
		{"lease TTL not whole seconds", roam.WithLeaseTTL(1500 * time.Millisecond), "whole seconds"},
		{"port over 65535", roam.WithAddress("127.0.0.1", 70000), "0..65535"},
		{"negative port", roam.WithAddress("127.0.0.1", -1), "0..65535"},
		{"no host", roam.WithAddress("", 0), "host"},
		{"chunk link port", roam.WithChunkLinkPort(-2), "-1..65535"},
		{"mesh name", roam.WithMesh(strings.Repeat("m", 300)), "mesh"},
		{"nil option", nil, "nil Option"},
		{"negative restore timeout", roam.WithRelocationConfig(roam.RelocationConfig{RestoreTimeout: -time.Second}), "negative"},
		{"payload budget", roam.WithRelocationConfig(roam.RelocationConfig{InFlightPayloadBudget: 1 << 40}), "InFlightPayloadBudget"},
		{"negative call timeout", roam.WithSpotConfig(roam.SpotConfig{DefaultTimeout: -time.Second}), "DefaultTimeout"},
		{"negative in-flight limit", roam.WithSpotConfig(roam.SpotConfig{InFlightPerPeer: -1}), "negative"},
		{"negative route cache bound", roam.WithSpotConfig(roam.SpotConfig{RouteCacheMaxRoutes: -1}), "RouteCacheMaxRoutes"},
		{"negative hold limit", roam.WithSessionConfig(roam.SessionConfig{HoldLimit: -1}), "negative"},
		{"placement page size", roam.WithPlacement(roam.PlacementConfig{PageSize: -1}), "placement"},
		{"transport limits", roam.WithTransportLimits(roam.TransportLimits{MaxConnections: -1}), "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := roam.New(actor.NewActorSystem(), roam.WithStore(store), c.opt)
			require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
			require.Contains(t, err.Error(), c.want)
		})
	}
	_, err := roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(roam.NewKind("k", nil, roam.PreserveState())))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "a kind without props")
	_, err = roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(roam.NewKind("k",
		actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.Policy{})))
	require.ErrorIs(t, err, roamerr.ErrNotConfigured, "a kind without a policy")
	_, err = roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(roam.FromClusterKind(nil, roam.PreserveState())))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "a nil cluster kind")
}

// Before Start and after Stop every call answers a typed error
// (InvalidOperation: no retry helps) instead of panicking.
func TestCallsBeforeStartAndAfterStop(t *testing.T) {
	ctx := context.Background()
	r, err := roam.New(actor.NewActorSystem(), roam.WithStore(memstore.New()), roam.WithKinds(counterKind))
	require.NoError(t, err)
	allRefused := func(t *testing.T, when string) {
		t.Helper()
		msg := wrapperspb.String("hi")
		ref := roam.SpotRef{SpotID: "s"}
		errs := map[string]error{}
		_, errs["Spots.Request"] = r.Spots().Request(ctx, "s", msg)
		errs["Spots.Send"] = r.Spots().Send(ctx, "s", msg)
		_, errs["Spots.Create"] = r.Spots().Create(ctx, "counter")
		_, errs["Spots.GetOrCreate"] = r.Spots().GetOrCreate(ctx, "s", "counter")
		_, errs["Spots.Find"] = r.Spots().Find(ctx, "s")
		_, errs["Spots.Query"] = r.Spots().Query(ctx, roam.SpotKindUser, 10, "")
		_, errs["Spots.Close"] = r.Spots().Close(ctx, ref)
		_, errs["Spots.SpawnMember"] = r.Spots().SpawnMember(ctx, ref, "counter", "a")
		_, errs["Spots.ReleaseEnded"] = r.Spots().ReleaseEnded(ctx, "s")
		_, errs["Relocate"] = r.Relocate(ctx, roam.ActorRef("a"), "x")
		_, errs["RelocateIfIdle"] = r.RelocateIfIdle(ctx, roam.ActorRef("a"), "x", time.Second)
		_, errs["Drain"] = r.Drain(ctx, roam.DrainOptions{})
		_, errs["Resolve"] = r.Resolve(ctx, roam.ActorRef("a"))
		_, errs["SpawnActor"] = r.SpawnActor(ctx, "counter", "a")
		_, errs["OpenSession"] = r.OpenSession(roam.SessionOptions{})
		_, errs["DeleteActor"] = r.DeleteActor(ctx, roam.ActorRef("a"))
		errs["LeaveSpot"] = r.LeaveSpot(ctx, roam.ActorRef("a"))
		_, errs["JoinSpot"] = r.JoinSpot(ctx, roam.ActorRef("a"), ref)
		_, errs["Nodes"] = r.Nodes(ctx)
		_, errs["ReleaseEnded"] = r.ReleaseEnded(ctx, roam.ActorRef("a"))
		for name, err := range errs {
			require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "%s %s", name, when)
		}
		require.Nil(t, r.Placement(), when)
		require.Equal(t, "", r.NodeName(), when)
	}
	allRefused(t, "before Start")
	require.NoError(t, r.Start(ctx))
	require.NoError(t, r.Stop(ctx))
	allRefused(t, "after Stop")
}

// A call's arguments and options out of range are refused before
// anything is sent.
func TestCallArgumentsRefused(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	r := start(t, store, roam.WithNodeName("only"))
	msg := wrapperspb.String("hi")
	var nilCtx context.Context
	for name, err := range map[string]error{
		"nil message":        r.Spots().Send(ctx, "s", nil),
		"nil context":        r.Spots().Send(nilCtx, "s", msg),
		"nil option":         r.Spots().Send(ctx, "s", msg, nil),
		"negative timeout":   r.Spots().Send(ctx, "s", msg, roam.Timeout(-time.Second)),
		"option twice":       r.Spots().Send(ctx, "s", msg, roam.Timeout(time.Second), roam.Timeout(time.Second)),
		"option not taken":   r.Spots().Send(ctx, "s", msg, roam.CreateRequest(msg)),
		"From(nil)":          r.Spots().Send(ctx, "s", msg, roam.From(nil)),
		"bad Spot ID":        r.Spots().Send(ctx, "", msg),
		"bad mesh":           r.Spots().Send(ctx, "s", msg, roam.InstanceSpot("counter"), roam.InMesh(strings.Repeat("m", 300))),
		"empty GetOrCreate":  second(r.Spots().GetOrCreate(ctx, "", "counter")),
		"Close with options": second(r.Spots().Close(ctx, roam.SpotRef{SpotID: "s"}, roam.InstanceSpot(""))),
		"query page size":    second(r.Spots().Query(ctx, roam.SpotKindUser, 0, "")),
		"drain concurrency":  second(r.Drain(ctx, roam.DrainOptions{Concurrency: -1})),
		"drain concurrency+": second(r.Drain(ctx, roam.DrainOptions{Concurrency: 100000})),
	} {
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, name)
	}
}

func second[T any](_ T, err error) error { return err }

// Start's errors are in the class that says what to do: a port in use or
// an address not of this host is the application's to fix
// (InvalidOperation), not a fault that retrying outlives.
func TestStartListenFailuresAreInvalidOperation(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	r, err := roam.New(actor.NewActorSystem(), roam.WithStore(memstore.New()), roam.WithAddress("127.0.0.1", l.Addr().(*net.TCPAddr).Port))
	require.NoError(t, err)
	err = r.Start(context.Background())
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "port in use")
	require.NotErrorIs(t, err, roamerr.ErrUnavailable)
	require.Contains(t, err.Error(), "WithAddress")
}

// The last node's drain cannot move anything: its units fail NotFound
// (no node to go to), not CapacityExceeded (no node is full).
func TestLastNodeDrainSaysNoOtherNode(t *testing.T) {
	ctx := context.Background()
	r := start(t, memstore.New(), roam.WithNodeName("last"))
	_, err := r.SpawnActor(ctx, "counter", "a")
	require.NoError(t, err)
	res, err := r.Drain(ctx, roam.DrainOptions{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.ErrorIs(t, res.Failed[0].Err, roamerr.ErrNotFound)
	require.NotErrorIs(t, res.Failed[0].Err, roamerr.ErrCapacityExceeded)
	require.Contains(t, res.Failed[0].Err.Error(), "no other live node")
}
