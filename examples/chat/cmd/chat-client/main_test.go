package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatclient"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
)

// Every flag is checked before the client connects anywhere.
func TestFlagsAreChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--name", "al", "--node", "7001"}, "--node must be host:port with a port from 1 to 65535"},
		{[]string{"--name", "al", "--node", "127.0.0.1:0"}, "--node must be host:port with a port from 1 to 65535"},
		{[]string{"--name", "al", "--node", ":7001"}, "--node must be host:port"},
		{[]string{"--name", "al", "--room", ""}, "--room must have from 1 to 255 bytes, got 0"},
		{[]string{"--name", "al", "--room", strings.Repeat("r", 256)}, "--room must have from 1 to 255 bytes, got 256"},
		{[]string{}, "--name must have from 1 to"},
		{[]string{"--name", strings.Repeat("n", chat.MaxNameBytes+1)}, "--name must have from 1 to"},
		{[]string{"--move-to", strings.Repeat("m", 256)}, "--move-to must have from 1 to 255 bytes"},
		{[]string{"--name", "al", "--connect-timeout", "0s"}, "--connect-timeout must be more than 0 and at most 1m0s"},
		{[]string{"--name", "al", "--connect-timeout", "2m"}, "--connect-timeout must be more than 0 and at most 1m0s"},
		{[]string{"--name", "al", "--tls-dir", "/nonexistent/certs"}, "--tls-dir must be a directory"},
		{[]string{"--name", "al", "lobby"}, `unexpected argument "lobby"`},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(c.args, &stderr)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error()+stderr.String(), c.says, "%v", c.args)
	}
	o, err := parseFlags([]string{"--node", "127.0.0.1:7002", "--name", "you"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "lobby", o.room)
	_, err = parseFlags([]string{"--move-to", "node-2"}, io.Discard)
	require.NoError(t, err, "the admin command needs no name")
	_, err = parseFlags([]string{"-h"}, io.Discard)
	require.ErrorIs(t, err, flag.ErrHelp)
}

// startNode starts a chat node with its gateway in this process; stop
// stops it as chat-node does at its end.
func startNode(t *testing.T) (node *roam.Roam, stop func()) {
	t.Helper()
	ctx := context.Background()
	system := actor.NewActorSystem()
	r, err := roam.New(system, roam.WithStore(memstore.New()), roam.WithNodeName("solo"), roam.WithKinds(chat.Kinds()...),
		roam.WithLogger(*testlog.Logger()), roam.WithDrainOnStop(false))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = r.Stop(ctx)
			system.Shutdown()
		})
	}
	t.Cleanup(stop)
	_, err = chat.StartGateway(r, *testlog.Logger())
	require.NoError(t, err)
	return r, stop
}

// output is what the command prints, as it prints it.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// session runs the command against addr with typed lines coming from the
// returned writer; done gets run's error.
func session(t *testing.T, addr string) (typed io.WriteCloser, out *output, done <-chan error) {
	t.Helper()
	in, typed := io.Pipe()
	out = &output{}
	ch := make(chan error, 1)
	o, err := parseFlags([]string{"--node", addr, "--room", "lobby", "--name", "you"}, io.Discard)
	require.NoError(t, err)
	go func() { ch <- run(context.Background(), o, in, out) }()
	t.Cleanup(func() { _ = typed.Close() })
	testwait.For(t, func() bool { return strings.Contains(out.String(), "joined lobby") }, "the client joined the room")
	return typed, out, ch
}

// ended waits for run to return, bounded by a few times the longest
// request it may be waiting on.
func ended(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(3 * chatclient.DefaultTimeout):
		t.Fatal("the command did not end")
		return nil
	}
}

// A mistyped command, or one without its argument, is answered with a
// usage line and never posted to the room.
func TestCommandsAreParsedNotPosted(t *testing.T) {
	node, _ := startNode(t)
	typed, out, done := session(t, node.System().Address())
	for _, line := range []string{"/foo", "/move", "/moveme", "/quit please", "hello", "//slash"} {
		_, err := io.WriteString(typed, line+"\n")
		require.NoError(t, err)
	}
	testwait.For(t, func() bool { return strings.Contains(out.String(), "you: /slash") }, "the posts came back from the room")
	_, err := io.WriteString(typed, "/quit\n")
	require.NoError(t, err)
	require.NoError(t, ended(t, done))

	printed := out.String()
	require.Contains(t, printed, "on solo with your Actor; you are connected to solo", "where the room is, to move it elsewhere")
	require.Contains(t, printed, "unknown command /foo; "+chatclient.Usage)
	require.Contains(t, printed, "usage: /move NODE (")
	require.Contains(t, printed, "usage: /moveme NODE (")
	require.Contains(t, printed, "usage: /quit (/quit takes no argument)")
	ctx, cancel := context.WithTimeout(context.Background(), 3*chat.DefaultTimeout)
	defer cancel()
	res, err := node.Spots().Request(ctx, "lobby", &chatpb.History{Room: "lobby"})
	require.NoError(t, err)
	var posts []string
	for _, p := range res.(*chatpb.Joined).GetHistory() {
		posts = append(posts, p.GetText())
	}
	require.Equal(t, []string{"hello", "/slash"}, posts, "only the posts reached the room")
}

// The command ends, saying why, when its node goes away.
func TestCommandEndsWhenItsNodeStops(t *testing.T) {
	node, stop := startNode(t)
	_, _, done := session(t, node.System().Address())
	stop()
	err := ended(t, done)
	require.True(t, errors.Is(err, chatclient.ErrNodeGone) || errors.Is(err, chatclient.ErrDisconnected), "%v", err)
}

// A dead address is reported at once, naming it.
func TestCommandReportsADeadAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	o, err := parseFlags([]string{"--node", addr, "--name", "you"}, io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*chatclient.DefaultDialTimeout)
	defer cancel()
	err = run(ctx, o, strings.NewReader(""), io.Discard)
	require.ErrorIs(t, err, chatclient.ErrUnreachable)
	require.Contains(t, err.Error(), addr)
}
