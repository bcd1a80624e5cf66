// Command chat-client connects to a node's gateway (a Session there, with
// the user's Actor bound to it), joins a chat room, shows the room live and
// posts the lines typed on stdin. "/move NODE" relocates the room to the
// node named NODE while everyone keeps chatting, "/moveme NODE" relocates
// your own Actor (you stay connected to your gateway); "/quit" leaves.
//
//	chat-client --node 127.0.0.1:7001 --room lobby --name alice
//	chat-client --node 127.0.0.1:7001 --room lobby --move-to node-b   # the admin command
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/messages"
)

func main() {
	node := flag.String("node", "127.0.0.1:7001", "a chat node's address (host:port)")
	room := flag.String("room", "lobby", "room to join")
	name := flag.String("name", "", "your name in the room")
	moveTo := flag.String("move-to", "", "relocate the room to this node and exit (admin)")
	tlsDir := flag.String("tls-dir", "", "mutual TLS: a directory with ca.pem, client.pem and client-key.pem (make certs)")
	flag.Parse()
	if err := run(*node, *room, *name, *moveTo, roam.TLSFromDir(*tlsDir, "client")); err != nil {
		fmt.Fprintln(os.Stderr, "chat-client:", err)
		os.Exit(1)
	}
}

func run(node, room, name, moveTo string, tls *roam.TLS) error {
	// Proto.Actor's own logs (connection chatter) stay out of the chat.
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	opts, err := roam.ClientRemoteOptions(tls, "127.0.0.1")
	if err != nil {
		return err
	}
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0, opts...))
	r.Start()
	defer r.Shutdown(false)
	gateway := actor.NewPID(node, chat.GatewayName)
	if moveTo != "" {
		return relocate(sys, gateway, &chatpb.Relocate{Room: room, To: moveTo})
	}
	if name == "" {
		return fmt.Errorf("--name is required to chat")
	}
	gone := make(chan string, 1)
	inbox := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch p := c.Message().(type) {
		case *chatpb.Posted:
			fmt.Printf("[%s #%d] %s: %s\n", p.GetRoom(), p.GetIndex(), p.GetName(), p.GetText())
		case *chatpb.PostRefused:
			fmt.Printf("(your post %d was not delivered: %s)\n", p.GetSeq(), p.GetError())
		case *chatpb.Recovered:
			fmt.Printf("(%s)\n", p.GetReason())
		case *chatpb.Disconnected:
			gone <- p.GetReason()
		}
	}))
	res, err := sys.Root.RequestFuture(gateway, &chatpb.Connect{Name: name, Inbox: &messages.PID{Address: inbox.Address, Id: inbox.Id}}, 10*time.Second).Result()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if a, ok := res.(*chatpb.Ack); ok {
		return fmt.Errorf("connect: %s", a.GetError())
	}
	go func() {
		reason := <-gone
		fmt.Fprintln(os.Stderr, "disconnected:", reason)
		os.Exit(1)
	}()
	res, err = sys.Root.RequestFuture(gateway, &chatpb.Join{Room: room, Member: &chatpb.Member{Name: name}}, 15*time.Second).Result()
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	switch j := res.(type) {
	case *chatpb.Joined:
		for _, p := range j.GetHistory() {
			fmt.Printf("[%s #%d] %s: %s\n", p.GetRoom(), p.GetIndex(), p.GetName(), p.GetText())
		}
		fmt.Printf("joined %s (%d members); /move NODE relocates it, /moveme NODE relocates you, /quit leaves\n", room, j.GetMembers())
	case *chatpb.Ack:
		return fmt.Errorf("join: %s", j.GetError())
	}
	in := bufio.NewScanner(os.Stdin)
	var seq uint64
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		switch {
		case line == "":
		case line == "/quit":
			quit(sys, gateway, room, name)
			return nil
		case strings.HasPrefix(line, "/move "):
			if err := relocate(sys, gateway, &chatpb.Relocate{Room: room, To: strings.TrimSpace(strings.TrimPrefix(line, "/move "))}); err != nil {
				fmt.Println("move:", err)
			}
		case strings.HasPrefix(line, "/moveme "):
			if err := relocate(sys, gateway, &chatpb.Relocate{User: name, To: strings.TrimSpace(strings.TrimPrefix(line, "/moveme "))}); err != nil {
				fmt.Println("move:", err)
			}
		default:
			seq++
			sys.Root.Send(gateway, &chatpb.Post{Room: room, Name: name, Seq: seq, Text: line})
		}
	}
	quit(sys, gateway, room, name)
	return in.Err()
}

// quit leaves the room, then the gateway (which ends the Session and the
// user's Actor).
func quit(sys *actor.ActorSystem, gateway *actor.PID, room, name string) {
	sys.Root.Send(gateway, &chatpb.Leave{Room: room, Name: name})
	sys.Root.Send(gateway, &chatpb.Leave{Name: name})
	time.Sleep(100 * time.Millisecond) // let the remote flush before the process ends
}

func relocate(sys *actor.ActorSystem, gateway *actor.PID, m *chatpb.Relocate) error {
	res, err := sys.Root.RequestFuture(gateway, m, 15*time.Second).Result()
	if err != nil {
		return err
	}
	r, ok := res.(*chatpb.Relocated)
	if !ok {
		return fmt.Errorf("unexpected answer %T", res)
	}
	if r.GetError() != "" {
		return fmt.Errorf("%s", r.GetError())
	}
	if r.GetFrom() == r.GetTo() {
		fmt.Printf("%s is already on %s\n", r.GetRoom(), r.GetTo())
		return nil
	}
	fmt.Printf("moved %s: %s -> %s, pause %.2f ms, %d bytes\n", r.GetRoom(), r.GetFrom(), r.GetTo(), float64(r.GetPauseMicros())/1000, r.GetBytes())
	return nil
}
