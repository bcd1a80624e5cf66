// Command chat-client connects to a node's gateway (a Session there, with
// the user's Actor bound to it), joins a chat room, shows the room live and
// posts the lines typed on stdin. "/move NODE" relocates the room to the
// node named NODE while everyone keeps chatting, "/moveme NODE" relocates
// your own Actor (you stay connected to your gateway), "/help" lists the
// commands, "/quit" (or end of input, or Ctrl-C) leaves; any other line
// starting with / is answered with the commands, not posted ("//text"
// posts "/text"). It exits 1 when its node goes away or ends its Session,
// saying so, and 2 on a wrong flag.
//
//	chat-client --node 127.0.0.1:7001 --room lobby --name alice
//	chat-client --node 127.0.0.1:7001 --room lobby --move-to node-b   # the admin command
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatclient"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/location"
)

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		if !errors.As(err, new(parseError)) {
			fmt.Fprintln(os.Stderr, "chat-client:", err)
		}
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "chat-client:", err)
		stop()
		os.Exit(1)
	}
}

// options are the command's flags, checked.
type options struct {
	node, room, name, moveTo string
	tls                      *roam.TLS
	connectTimeout           time.Duration
}

// maxConnectTimeout bounds --connect-timeout: past it a user at a
// terminal has long given up.
const maxConnectTimeout = time.Minute

// parseFlags parses and checks every flag, so that a wrong one stops the
// command before it connects anywhere, saying what it accepts.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("chat-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.node, "node", "127.0.0.1:7001", "a chat node's address (host:port): its --listen address")
	fs.StringVar(&o.room, "room", "lobby", "room to join")
	fs.StringVar(&o.name, "name", "", "your name in the room (required to chat)")
	fs.StringVar(&o.moveTo, "move-to", "", "relocate the room to this node and exit (admin)")
	tlsDir := fs.String("tls-dir", "", "mutual TLS: a directory with ca.pem, client.pem and client-key.pem (make certs)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", chatclient.DefaultDialTimeout, "how long to try reaching the node before giving up")
	if err := fs.Parse(args); err != nil {
		return o, parseError{err} // printed by the flag package, with the flags
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every option is a flag (-h lists them)", fs.Arg(0))
	}
	host, port, err := net.SplitHostPort(o.node)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return o, fmt.Errorf("--node must be host:port with a port from 1 to 65535 (a chat node's --listen address), got %q", o.node)
	}
	if err := checkID("--room", o.room, location.MaxIDBytes, true); err != nil {
		return o, err
	}
	if err := checkID("--move-to", o.moveTo, location.MaxIDBytes, false); err != nil {
		return o, err
	}
	if o.moveTo == "" {
		if err := checkID("--name", o.name, chat.MaxNameBytes, true); err != nil {
			return o, fmt.Errorf("%w (to chat; --move-to needs no name)", err)
		}
	}
	if o.connectTimeout <= 0 || o.connectTimeout > maxConnectTimeout {
		return o, fmt.Errorf("--connect-timeout must be more than 0 and at most %s, got %s", maxConnectTimeout, o.connectTimeout)
	}
	if *tlsDir != "" {
		if st, err := os.Stat(*tlsDir); err != nil || !st.IsDir() {
			return o, fmt.Errorf("--tls-dir must be a directory with ca.pem, client.pem and client-key.pem (make certs), got %q", *tlsDir)
		}
	}
	o.tls = roam.TLSFromDir(*tlsDir, "client")
	return o, nil
}

// checkID checks a name the node will check too, so that a wrong one
// fails here, before connecting.
func checkID(flagName, v string, max int, required bool) error {
	if v == "" && !required {
		return nil
	}
	if v == "" || len(v) > max {
		return fmt.Errorf("%s must have from 1 to %d bytes, got %d", flagName, max, len(v))
	}
	return nil
}

// syncWriter serializes writes: the room's posts are printed from the
// client's inbox while the command loop prints its answers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, format, a...)
}

// requestTimeout bounds the leaving requests at the end: the process is
// ending anyway.
const requestTimeout = 5 * time.Second

func run(ctx context.Context, o options, in io.Reader, stdout io.Writer) error {
	out := &syncWriter{w: stdout}
	cl, err := chatclient.Dial(ctx, chatclient.Config{Node: o.node, TLS: o.tls, DialTimeout: o.connectTimeout,
		OnEvent: func(m proto.Message) { show(out, m) }})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		_ = cl.Close(cctx)
	}()
	if o.moveTo != "" {
		return relocate(ctx, cl, out, &chatpb.Relocate{Room: o.room, To: o.moveTo})
	}
	if err := cl.Connect(ctx, o.name); err != nil {
		return err
	}
	j, err := cl.Join(ctx, o.room)
	if err != nil {
		return err
	}
	for _, p := range j.GetHistory() {
		show(out, p)
	}
	// Where the room is, so that a /move or /moveme names another node:
	// joining took the user's Actor to the room's node.
	out.printf("joined %s (%d members), on %s with your Actor; you are connected to %s. /move NODE moves the room, /moveme NODE moves your Actor, /help, /quit\n",
		o.room, j.GetMembers(), j.GetNode(), cl.Node())

	lines := make(chan string)
	stop := make(chan struct{})
	defer close(stop)
	var scanErr error
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-stop:
				return
			}
		}
		scanErr = sc.Err()
	}()
	leave := func() {
		lctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		_ = cl.Leave(lctx, o.room)
	}
	for {
		var line string
		var ok bool
		select {
		case <-cl.Done():
			return cl.Err()
		case <-ctx.Done():
			leave()
			return nil
		case line, ok = <-lines:
		}
		if !ok {
			leave()
			return scanErr
		}
		c, err := chatclient.Parse(line)
		if err != nil {
			out.printf("%v\n", err)
			continue
		}
		switch c.Op {
		case chatclient.OpPost:
			if seq, err := cl.Post(ctx, o.room, c.Arg); err != nil {
				out.printf("(your post %d was not delivered: %v)\n", seq, err)
			}
		case chatclient.OpMove:
			if err := relocate(ctx, cl, out, &chatpb.Relocate{Room: o.room, To: c.Arg}); err != nil {
				out.printf("%v\n", err)
			}
		case chatclient.OpMoveMe:
			if err := relocate(ctx, cl, out, &chatpb.Relocate{User: o.name, To: c.Arg}); err != nil {
				out.printf("%v\n", err)
			}
		case chatclient.OpHelp:
			out.printf("%s\n", chatclient.Usage)
		case chatclient.OpQuit:
			leave()
			return nil
		}
	}
}

// show prints what the node pushed.
func show(out *syncWriter, m proto.Message) {
	switch p := m.(type) {
	case *chatpb.Posted:
		out.printf("[%s #%d] %s: %s\n", p.GetRoom(), p.GetIndex(), p.GetName(), p.GetText())
	case *chatpb.PostRefused:
		out.printf("(your post %d was not delivered: %s)\n", p.GetSeq(), p.GetError())
	case *chatpb.Recovered:
		out.printf("(%s)\n", p.GetReason())
	}
}

func relocate(ctx context.Context, cl *chatclient.Client, out *syncWriter, m *chatpb.Relocate) error {
	r, err := cl.Relocate(ctx, m)
	if err != nil {
		return err
	}
	if r.GetFrom() == r.GetTo() {
		out.printf("%s is already on %s\n", r.GetRoom(), r.GetTo())
		return nil
	}
	out.printf("moved %s: %s -> %s, pause %.2f ms, %d bytes\n", r.GetRoom(), r.GetFrom(), r.GetTo(), float64(r.GetPauseMicros())/1000, r.GetBytes())
	return nil
}

// parseError is a flag the flag package could not parse: it has printed
// the error and the flags already.
type parseError struct{ error }

func (e parseError) Unwrap() error { return e.error }
