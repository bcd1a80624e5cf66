package meshnode_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// Anyone who reaches a node's port can call Proto.Actor's remote service.
// Its unimplemented RPCs (whose handlers panic) are refused, and a stream
// whose handler panics on a malformed batch ends with an error: the node
// process goes on serving.
func TestRemoteCallsThatPanicLeaveTheNodeServing(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	conn, err := grpc.Dial(n.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := remote.NewRemotingClient(conn)
	ctx := context.Background()

	_, err = client.ListProcesses(ctx, &remote.ListProcessesRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	_, err = client.GetProcessDiagnostics(ctx, &remote.GetProcessDiagnosticsRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)

	// A batch naming a message type the batch does not have.
	stream, err := client.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		Envelopes: []*remote.MessageEnvelope{{TypeId: 7, Target: 3, Sender: 9, SerializerId: 4}},
	}}}))
	_, err = stream.Recv()
	require.Error(t, err, "the stream ends")

	_, err = client.ListProcesses(ctx, &remote.ListProcessesRequest{})
	require.Equal(t, codes.Unimplemented, status.Code(err), "the node still serves: %v", err)
	require.True(t, n.Valid())
}

// An application's own RemoteOptions (server options for TLS, say) add to
// roam's frame limits instead of replacing them: a 5 MiB frame, over
// gRPC's 4 MiB default, is still accepted.
func TestRemoteOptionsKeepTheFrameLimits(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		RemoteOptions: []remote.ConfigOption{remote.WithServerOptions(grpc.ConnectionTimeout(30 * time.Second))}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	conn, err := grpc.Dial(n.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(meshnode.MaxFrameBytes)))
	require.NoError(t, err)
	defer conn.Close()
	stream, err := remote.NewRemotingClient(conn).Receive(context.Background())
	require.NoError(t, err)
	big := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{strings.Repeat("x", 5<<20)},
	}}}
	require.NoError(t, stream.Send(big))
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF, "the server took the frame and ended the stream cleanly: %v", err)
}

// A peer's actor.Stop to any actor — Proto.Actor's own endpoint supervisor
// included, whose stop made the next send to a new peer panic the process
// — and a message for another node's actor (which Proto.Actor would pass
// on) are dropped, each alone: the rest of the batch arrives, the stream
// goes on, and the node can still reach new peers.
func TestStopsAndRelaysFromAPeerAreDropped(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	got := make(chan string, 4)
	_, err = n.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if s, ok := c.Message().(*wrapperspb.StringValue); ok {
			got <- s.Value
		}
	}), "probe")
	require.NoError(t, err)
	conn, err := grpc.Dial(n.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	stream, err := remote.NewRemotingClient(conn).Receive(context.Background())
	require.NoError(t, err)
	hello, _ := proto.Marshal(wrapperspb.String("hello"))
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{"actor.Stop", "google.protobuf.StringValue", "actor.PoisonPill"},
		Targets: []*actor.PID{{Address: n.Address(), Id: "EndpointSupervisor"}, {Address: "127.0.0.1:1", Id: "elsewhere"},
			{Address: n.Address(), Id: "probe"}},
		Envelopes: []*remote.MessageEnvelope{
			{TypeId: 0, Target: 0}, {TypeId: 1, Target: 1, MessageData: hello}, {TypeId: 2, Target: 2}, {TypeId: 1, Target: 2, MessageData: hello},
		},
	}}}))
	select {
	case s := <-got:
		require.Equal(t, "hello", s)
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the batch's own message never arrived")
	}
	// The node still starts an endpoint to a peer it never talked to (with
	// its endpoint supervisor stopped, this panicked the process).
	n.System().Root.Send(actor.NewPID("127.0.0.1:1", "nobody"), wrapperspb.String("x"))
	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorIs(t, err, io.EOF, "the stream went on and ended cleanly: %v", err)
	require.True(t, n.Valid())
}

// A peer connection's outgoing queue starts small (Proto.Actor's default
// pre-sizes it for a million messages, 16 MiB per peer); an application's
// own remote option still wins.
func TestPeerQueueStartsSmallUnlessTheApplicationSaysOtherwise(t *testing.T) {
	sys := actor.NewActorSystem()
	cfg, err := meshnode.RemoteConfig(sys, "127.0.0.1", 0, meshnode.RemoteOptions{})
	require.NoError(t, err)
	require.Less(t, cfg.EndpointWriterQueueSize, remote.Configure("127.0.0.1", 0).EndpointWriterQueueSize)
	own, err := meshnode.RemoteConfig(sys, "127.0.0.1", 0, meshnode.RemoteOptions{Options: []remote.ConfigOption{remote.WithEndpointWriterQueueSize(5000)}})
	require.NoError(t, err)
	require.Equal(t, 5000, own.EndpointWriterQueueSize)
}

// Proto.Actor's futures are numbered from a counter per actor system, and
// its remote waits on one when a node first talks to a peer: a peer that
// sprayed answers at the first numbers answered it, and the process
// panicked. A node's counter starts at a random 62-bit number, so a
// future's name (here the next one after the node started) cannot be
// guessed from outside.
func TestFutureNamesCannotBeGuessed(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		n, err := meshnode.Start(ctx, meshnode.Config{Store: store})
		require.NoError(t, err)
		t.Cleanup(func() { _ = n.Stop(ctx) })
		id := actor.NewFuture(n.System(), time.Second).PID().Id
		// "future$" and 11 digits of 64: at least 2^60.
		require.GreaterOrEqual(t, len(id), len("future$")+11, "a future named %s", id)
		require.False(t, seen[id], "two nodes named their first future alike: %s", id)
		seen[id] = true
	}
}
