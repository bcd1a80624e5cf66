package meshnode_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
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

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

func limitedNode(t *testing.T, l meshnode.Limits) *meshnode.Node {
	t.Helper()
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Limits: l})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	return n
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// A flood of watches from a peer, each with a new watcher, is held to the
// node's limits: roam's own actors take none, an application's actor
// takes the peer's share, and the rest are dropped and counted; the
// node's memory does not grow with the flood.
func TestAWatchFloodIsBounded(t *testing.T) {
	n := limitedNode(t, meshnode.Limits{MaxRemoteWatches: 200, MaxRemoteWatchesPerPeer: 100})
	_, err := n.System().Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "app")
	require.NoError(t, err)
	_, err = n.System().Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "roam/spot")
	require.NoError(t, err)
	stream, _ := connectAs(t, n.Address(), insecure.NewCredentials(), "127.0.0.1:9")
	before := heapInUse()
	const flood, batch = 100_000, 1000
	for i := 0; i < flood; i += batch {
		b := &remote.MessageBatch{TypeNames: []string{"actor.Watch"},
			Targets: []*actor.PID{{Address: n.Address(), Id: "app"}, {Address: n.Address(), Id: "roam/spot"}}}
		for j := range batch {
			data, _ := proto.Marshal(&actor.Watch{Watcher: &actor.PID{Address: "127.0.0.1:9", Id: "w" + strconv.Itoa(i+j)}})
			b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{TypeId: 0, Target: int32(j % 2), MessageData: data})
		}
		require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}))
	}
	testwait.For(t, func() bool { return n.TransportRefusals().Watches == flood-100 }, "the flood's watches were not all judged")
	grown := int64(heapInUse()) - int64(before)
	require.Less(t, grown, int64(8<<20), "the heap grew %d bytes with %d refused watches", grown, flood-100)
	require.True(t, n.Valid())
}

// Connections past the node's limit are closed as they arrive, a stream
// that sends nothing is ended after the first-frame timeout, and a
// connection that never completes its handshake is closed: a flood of
// them leaves the node's goroutines bounded.
func TestAConnectionFloodIsBounded(t *testing.T) {
	n := limitedNode(t, meshnode.Limits{MaxConnections: 20, FirstFrameTimeout: 300 * time.Millisecond})
	goroutines := runtime.NumGoroutine()

	// Silent streams: opened, nothing sent.
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var silent []remote.Remoting_ReceiveClient
	for range 10 {
		c, err := grpc.Dial(n.Address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		conns = append(conns, c)
		s, err := remote.NewRemotingClient(c).Receive(context.Background())
		require.NoError(t, err)
		silent = append(silent, s)
	}
	for _, s := range silent {
		_, err := s.Recv()
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a silent stream is ended: %v", err)
	}
	require.GreaterOrEqual(t, n.TransportRefusals().Streams, int64(10))
	for _, c := range conns {
		c.Close()
	}

	// Raw TCP connections that never say anything: closed after the
	// handshake timeout; past the limit, at once.
	var raw []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", n.Address())
		require.NoError(t, err)
		raw = append(raw, c)
	}
	for _, c := range raw {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(testwait.Patience(t))))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("a connection that never handshook was kept open")
		}
		c.Close()
	}
	require.Positive(t, n.TransportRefusals().Connections, "connections past the limit were refused")
	testwait.For(t, func() bool { return runtime.NumGoroutine() <= goroutines+20 }, "the flood's goroutines did not end")
	require.True(t, n.Valid())
}

// A Terminated from a peer names an actor of its own process: one naming
// any other address is dropped (Proto.Actor would dial that address to
// deliver it, so a peer could make the node dial anywhere).
func TestForgedTerminationsAreDropped(t *testing.T) {
	n := limitedNode(t, meshnode.Limits{})
	stream, _ := connectAs(t, n.Address(), insecure.NewCredentials(), "127.0.0.1:9")
	goroutines := runtime.NumGoroutine()
	before := n.TransportRefusals().Messages
	const forged = 200
	b := &remote.MessageBatch{TypeNames: []string{"actor.Terminated"}, Targets: []*actor.PID{{Address: n.Address(), Id: "anyone"}}}
	for i := range forged {
		data, _ := proto.Marshal(&actor.Terminated{Who: &actor.PID{Address: "127.0.0.1:" + strconv.Itoa(20000+i), Id: "x"}})
		b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{TypeId: 0, Target: 0, MessageData: data})
	}
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}))
	testwait.For(t, func() bool { return n.TransportRefusals().Messages-before == forged }, "the forged terminations were not all dropped")
	require.LessOrEqual(t, runtime.NumGoroutine(), goroutines+20, "the node dialled the forged addresses")
}

// A node made to send to addresses where nothing listens leaves no
// connection behind once it gives them up: Proto.Actor dials anew on each
// retry without closing the connection it failed on, and gRPC would keep
// each reconnecting for ever.
func TestUnreachablePeersLeaveNothingBehind(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(),
		RemoteOptions: []remote.ConfigOption{func(c *remote.Config) { c.MaxRetryCount = 2 }}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	goroutines := runtime.NumGoroutine()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		address := l.Addr().String()
		require.NoError(t, l.Close())
		n.System().Root.Send(actor.NewPID(address, "nobody"), &actor.Watch{})
	}
	testwait.For(t, func() bool { return runtime.NumGoroutine() <= goroutines+10 }, "connections to unreachable peers were left behind")
}

// A peer's watch must name a watcher of its own process (the node tells
// the watcher when the actor stops, so it would dial where the peer
// says), and lasts as long as the stream that brought it: a peer's
// budget is free again once its stream ended.
func TestWatchesAreThePeersOwnAndLastAsLongAsTheirStream(t *testing.T) {
	n := limitedNode(t, meshnode.Limits{MaxRemoteWatchesPerPeer: 10})
	_, err := n.System().Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "app")
	require.NoError(t, err)
	const peer = "127.0.0.1:9"
	open := func() (remote.Remoting_ReceiveClient, func()) {
		return connectAs(t, n.Address(), insecure.NewCredentials(), peer)
	}
	watch := func(s remote.Remoting_ReceiveClient, watcher string, from, to int) {
		b := &remote.MessageBatch{TypeNames: []string{"actor.Watch"}, Targets: []*actor.PID{{Address: n.Address(), Id: "app"}}}
		for i := from; i < to; i++ {
			data, _ := proto.Marshal(&actor.Watch{Watcher: &actor.PID{Address: watcher, Id: "w" + strconv.Itoa(i)}})
			b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{TypeId: 0, Target: 0, MessageData: data})
		}
		require.NoError(t, s.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}))
	}
	s, closeFirst := open()
	messages := n.TransportRefusals().Messages
	watch(s, "198.51.100.7:80", 0, 1)
	testwait.For(t, func() bool { return n.TransportRefusals().Messages == messages+1 }, "a watcher elsewhere was not refused")
	watch(s, peer, 0, 11)
	testwait.For(t, func() bool { return n.TransportRefusals().Watches == 1 }, "the watch past the budget was not refused")
	closeFirst()

	testwait.For(t, func() bool { return n.RemoteWatches() == 0 }, "the ended stream's watches were not forgotten")
	s, closeSecond := open()
	defer closeSecond()
	// Its budget is free again: ten fit, the eleventh does not.
	watch(s, peer, 100, 111)
	testwait.For(t, func() bool { return n.TransportRefusals().Watches == 2 }, "the budget was not free again")
	require.Equal(t, 10, n.RemoteWatches())
}
