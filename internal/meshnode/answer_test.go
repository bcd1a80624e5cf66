package meshnode_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/devca"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// askedNode spawns on n an actor "asked" that hands every request's reply
// route to routes and answers nothing itself.
func askedNode(t *testing.T, n *meshnode.Node) <-chan *actor.PID {
	t.Helper()
	routes := make(chan *actor.PID, 4)
	_, err := n.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*wrapperspb.StringValue); ok {
			routes <- c.Sender()
		}
	}), "asked")
	require.NoError(t, err)
	return routes
}

// connectAs opens a raw peer stream to address with creds on a connection
// of its own, connected as the node at declared, as Proto.Actor's endpoint
// writer does; close ends the connection (also at the test's end).
func connectAs(t *testing.T, address string, creds credentials.TransportCredentials, declared string) (s remote.Remoting_ReceiveClient, close func()) {
	t.Helper()
	conn, err := grpc.Dial(address, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	s, err = remote.NewRemotingClient(conn).Receive(context.Background())
	require.NoError(t, err)
	require.NoError(t, s.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "peer", Address: declared}}}}}))
	return s, func() { conn.Close() }
}

// forge sends msg to route over a raw stream to route's node that
// declares itself as the node at declared.
func forge(t *testing.T, creds credentials.TransportCredentials, route *actor.PID, declared string, msg proto.Message) {
	t.Helper()
	stream, _ := connectAs(t, route.Address, creds, declared)
	data, err := proto.Marshal(msg)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{string(proto.MessageName(msg))}, Targets: []*actor.PID{{Address: route.Address, Id: route.Id}},
		Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, MessageData: data}},
	}}}))
}

// A question is answered only by the node asked, and only with its own
// answer: a reply from a connection of another node, one that is not the
// answer (the wrong operation), and one after the answer are dropped and
// counted, and the question waits on for the real one. Its reply route is
// not one of Proto.Actor's numbered futures, so a spray at those reaches
// nothing.
func TestOnlyTheNodeAskedAnswersItsQuestion(t *testing.T) {
	store := memstore.New()
	a, b := start(t, store), start(t, store)
	routes := askedNode(t, b)
	type result struct {
		msg any
		err error
	}
	answered := make(chan result, 1)
	go func() {
		msg, err := ask.Ask(context.Background(), a.System(), actor.NewPID(b.Address(), "asked"), wrapperspb.String("op-1?"), testwait.Patience(t),
			ask.Question{From: b.Address(), What: "test question", Accept: func(m any) bool {
				s, ok := m.(*wrapperspb.StringValue)
				return ok && s.Value == "op-1"
			}})
		answered <- result{msg, err}
	}()
	var route *actor.PID
	select {
	case route = <-routes:
	case <-t.Context().Done():
	}
	require.NotNil(t, route)
	require.True(t, ask.IsRoute(route.Id), route.Id)

	// The attacker sprays Proto.Actor's future numbers: nothing waits there.
	for i := 1; i <= 50; i++ {
		forge(t, insecure.NewCredentials(), actor.NewPID(a.Address(), "future$"+strconv.Itoa(i)), "127.0.0.1:9", wrapperspb.String("op-1"))
	}
	// It learnt the route and answers from its own connection.
	before := ask.Refused()
	forge(t, insecure.NewCredentials(), route, "127.0.0.1:9", wrapperspb.String("op-1"))
	testwait.For(t, func() bool { return ask.Refused() > before }, "the forged answer was not refused")
	// The node asked answers something else.
	before = ask.Refused()
	b.System().Root.Send(route, wrapperspb.String("op-2"))
	testwait.For(t, func() bool { return ask.Refused() > before }, "the wrong answer was not refused")
	select {
	case r := <-answered:
		t.Fatalf("the question ended on a refused answer: %v %v", r.msg, r.err)
	default:
	}
	// The real answer.
	b.System().Root.Send(route, wrapperspb.String("op-1"))
	r := <-answered
	require.NoError(t, r.err)
	require.Equal(t, "op-1", r.msg.(*wrapperspb.StringValue).Value)
	// Its repetition by the node asked finds no question: late, dropped.
	late := ask.LateAnswers()
	b.System().Root.Send(route, wrapperspb.String("op-1"))
	testwait.For(t, func() bool { return ask.LateAnswers() > late }, "the repeated answer was not dropped as late")
	// Repeated from elsewhere it is refused.
	before = ask.Refused()
	forge(t, insecure.NewCredentials(), route, "127.0.0.1:9", wrapperspb.String("op-1"))
	testwait.For(t, func() bool { return ask.Refused() > before }, "the replayed answer was not refused")
}

// With mutual TLS, a member that learnt a question's reply route cannot
// answer it for the node asked, even from the same host and declaring
// that node's address: its certificate names another node. The question
// waits on for the real answer.
func TestWithTLSOnlyTheNodeAskedAnswers(t *testing.T) {
	ca, err := devca.New("cluster")
	require.NoError(t, err)
	store := memstore.New()
	a, b := tlsNodeIn(t, ca, store, "a"), tlsNodeIn(t, ca, store, "b")
	routes := askedNode(t, b)
	answered := make(chan any, 1)
	go func() {
		msg, _ := ask.Ask(context.Background(), a.System(), actor.NewPID(b.Address(), "asked"), wrapperspb.String("?"), testwait.Patience(t),
			ask.Question{From: b.Address(), What: "test question"})
		answered <- msg
	}()
	var route *actor.PID
	select {
	case route = <-routes:
	case <-t.Context().Done():
	}
	require.NotNil(t, route)
	before := ask.Refused()
	forge(t, nodeCreds(t, ca, ca, "mallory", "127.0.0.1"), route, b.Address(), wrapperspb.String("forged"))
	testwait.For(t, func() bool { return ask.Refused() > before }, "the forged answer was not refused")
	b.System().Root.Send(route, wrapperspb.String("real"))
	require.Equal(t, "real", (<-answered).(*wrapperspb.StringValue).GetValue())
}
