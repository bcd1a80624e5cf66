package chatclient_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatclient"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// nodeEnv makes the test binary a chat node (TestMain), for the test that
// kills one.
const nodeEnv = "CHATCLIENT_TEST_NODE"

func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) == "1" {
		serveNode()
		return
	}
	os.Exit(m.Run())
}

// serveNode runs one chat node and its gateway, prints its address and
// serves until killed.
func serveNode() {
	r, err := roam.New(actor.NewActorSystem(), roam.WithStore(memstore.New()), roam.WithNodeName("doomed"),
		roam.WithKinds(chat.Kinds()...), roam.WithLogger(zerolog.Nop()))
	if err == nil {
		err = r.Start(context.Background())
	}
	if err == nil {
		_, err = chat.StartGateway(r, zerolog.Nop())
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("serving", r.System().Address())
	select {}
}

// node is a chat node with its gateway in this process.
type node struct {
	*roam.Roam
	stopOnce sync.Once
}

// stop stops the node as chat-node does at its end: drained, stopped,
// its actor system shut down.
func (n *node) stop() {
	n.stopOnce.Do(func() {
		_ = n.Stop(context.Background())
		n.System().Shutdown()
	})
}

// startNodes starts chat nodes with their gateways in this process, on
// one store.
func startNodes(t *testing.T, names ...string) []*node {
	t.Helper()
	ctx := context.Background()
	store := memstore.New()
	var nodes []*node
	for _, name := range names {
		system := actor.NewActorSystem()
		r, err := roam.New(system, roam.WithStore(store), roam.WithNodeName(name), roam.WithKinds(chat.Kinds()...),
			roam.WithLogger(*testlog.Logger()))
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		n := &node{Roam: r}
		t.Cleanup(n.stop)
		_, err = chat.StartGateway(r, *testlog.Logger())
		require.NoError(t, err)
		nodes = append(nodes, n)
	}
	return nodes
}

// events collects what a client's node pushed to it.
type events struct {
	mu  sync.Mutex
	got []proto.Message
}

func (e *events) add(m proto.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, m)
}

func (e *events) posted(text string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.got {
		if p, ok := m.(*chatpb.Posted); ok && p.GetText() == text {
			return true
		}
	}
	return false
}

// connected dials addr, connects as name and joins room.
func connected(t *testing.T, addr, name, room string) (*chatclient.Client, *events) {
	return connectedWith(t, chatclient.Config{Node: addr}, name, room)
}

func connectedWith(t *testing.T, cfg chatclient.Config, name, room string) (*chatclient.Client, *events) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultTimeout)
	defer cancel()
	ev := &events{}
	cfg.OnEvent = ev.add
	cl, err := chatclient.Dial(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultTimeout)
		defer cancel()
		_ = cl.Close(cctx)
	})
	require.NoError(t, cl.Connect(ctx, name))
	_, err = cl.Join(ctx, room)
	require.NoError(t, err)
	return cl, ev
}

// toldGone waits for the client to be told it can no longer chat, and
// checks that a post then fails, with that news, instead of vanishing.
func toldGone(t *testing.T, cl *chatclient.Client, room string) {
	t.Helper()
	select {
	case <-cl.Done():
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the client was never told that its node went away")
	}
	gone := cl.Err()
	t.Logf("told: %v", gone)
	require.True(t, errors.Is(gone, chatclient.ErrNodeGone) || errors.Is(gone, chatclient.ErrDisconnected), "%v", gone)
	require.ErrorIs(t, gone, roamerr.ErrUnavailable)
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultTimeout)
	defer cancel()
	_, err := cl.Post(ctx, room, "anyone there?")
	require.Error(t, err, "a post through a node that is gone fails")
	require.ErrorIs(t, err, gone, "and says why")
}

// A client whose node stops is told so, and a post after fails at once
// with the reason instead of vanishing into the ended connection.
func TestClientIsToldItsNodeStopped(t *testing.T) {
	nodes := startNodes(t, "front", "back")
	cl, ev := connected(t, nodes[0].System().Address(), "ann", "lobby")
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultTimeout)
	defer cancel()
	_, err := cl.Post(ctx, "lobby", "hello")
	require.NoError(t, err)
	testwait.For(t, func() bool { return ev.posted("hello") }, "the post came back from the room")

	nodes[0].stop()
	toldGone(t, cl, "lobby")
}

// nodeProcess starts a chat node in a process of its own and returns it
// with its address.
func nodeProcess(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the node process says where it serves")
	addr, ok := strings.CutPrefix(lines.Text(), "serving ")
	require.True(t, ok, "%s", lines.Text())
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd, addr
}

// A client whose node is killed (SIGKILL: not a word sent) learns it from
// the connection's end, and a post after fails.
func TestClientIsToldItsNodeWasKilled(t *testing.T) {
	cmd, addr := nodeProcess(t)
	cl, _ := connected(t, addr, "bo", "lobby")
	require.NoError(t, cmd.Process.Kill())
	toldGone(t, cl, "lobby")
	require.ErrorIs(t, cl.Err(), chatclient.ErrNodeGone, "nobody was there to say anything else")
	require.Contains(t, cl.Err().Error(), addr, "the news names the node's address")
}

// A node that stops answering without its connections ending (paused
// here, as a network cut would look) fails the client's next post once
// the request's timeout passes, and the client counts it gone.
func TestClientGivesUpOnANodeThatDoesNotAnswer(t *testing.T) {
	cmd, addr := nodeProcess(t)
	// Long enough for the connect and the join on a busy machine; the
	// post's answer would take microseconds.
	const timeout = 3 * time.Second
	cl, _ := connectedWith(t, chatclient.Config{Node: addr, Timeout: timeout}, "eve", "lobby")
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	// kill returns before the node's threads stop: on a busy machine one
	// may still answer a post that arrives meanwhile.
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	testwait.For(t, func() bool {
		b, err := os.ReadFile(stat)
		// The state follows the command name in parentheses.
		return err == nil && strings.HasPrefix(string(b[bytes.LastIndexByte(b, ')')+1:]), " T")
	}, "the node process stopped after SIGSTOP")
	ctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
	defer cancel()
	_, err := cl.Post(ctx, "lobby", "hello?")
	require.ErrorIs(t, err, chatclient.ErrNodeGone)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the request's own timeout ended it, not the caller's")
	require.Contains(t, err.Error(), "did not answer the post")
	toldGone(t, cl, "lobby")
}

// deadAddress is an address nothing listens on.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// Dialing an address nothing listens on fails with ErrUnreachable, naming
// the address and what to check, not with a bare request timeout.
func TestDialDeadAddressFailsClearly(t *testing.T) {
	addr := deadAddress(t)
	// Bounded by a few times the dial's own timeout: the dial must end by
	// itself, not by this context.
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultDialTimeout)
	defer cancel()
	_, err := chatclient.Dial(ctx, chatclient.Config{Node: addr})
	require.ErrorIs(t, err, chatclient.ErrUnreachable)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), addr)
	require.Contains(t, err.Error(), "check that a chat node runs there")
	require.NotContains(t, err.Error(), "future: timeout")

	_, err = chatclient.Dial(ctx, chatclient.Config{Node: "no-port"})
	require.ErrorIs(t, err, chatclient.ErrUnreachable)
	require.Contains(t, err.Error(), "host:port")
}

// A listener that accepts connections but is no chat node: the connect
// fails with ErrUnreachable naming the address and what to check once the
// request's timeout passes, not with Proto.Actor's bare timeout.
func TestConnectToNonChatListenerFailsClearly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		var held []net.Conn // accepted and never answered
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	const timeout = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*timeout+3*chatclient.DefaultDialTimeout)
	defer cancel()
	cl, err := chatclient.Dial(ctx, chatclient.Config{Node: l.Addr().String(), Timeout: timeout})
	require.NoError(t, err, "something listens there")
	defer func() { _ = cl.Close(ctx) }()
	err = cl.Connect(ctx, "cy")
	require.ErrorIs(t, err, chatclient.ErrUnreachable)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), l.Addr().String())
	require.Contains(t, err.Error(), "chat node's")
}

// Close leaves: once it returns, the node holds nothing of the client
// (its Actor is deleted, its Session closed), so a node stopped after it
// ends no Session of it: nothing to report as a disconnection.
func TestCloseReleasesTheClientBeforeItReturns(t *testing.T) {
	nodes := startNodes(t, "solo")
	cl, _ := connected(t, nodes[0].System().Address(), "dee", "lobby")
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultTimeout)
	defer cancel()
	_, err := nodes[0].Resolve(ctx, roam.ActorRef(chat.UserActor("dee")))
	require.NoError(t, err, "connected: the user's Actor exists")
	require.NoError(t, cl.Close(ctx))
	require.ErrorIs(t, cl.Err(), chatclient.ErrClosed)
	_, err = nodes[0].Resolve(ctx, roam.ActorRef(chat.UserActor("dee")))
	require.ErrorIs(t, err, roamerr.ErrNotFound, "the user's Actor was deleted before Close returned")
}
