// Command chat-node runs chat rooms on a roam node and serves chat clients
// through its gateway.
//
//	chat-node --store consul --consul 127.0.0.1:8500 --listen 127.0.0.1:7001 --name node-a
//	chat-node --store consul --consul 10.0.0.1:8500,10.0.0.2:8500 ...  # outlives either agent
//	chat-node --store memory --nodes 3 --listen 127.0.0.1:7001 --name node   # node-1..3 in one process
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/memstore"
)

func main() {
	storeKind := flag.String("store", "memory", "location store: memory (nodes in this process only) | consul")
	consulAddr := flag.String("consul", "127.0.0.1:8500", "Consul HTTP address, or several agents' addresses separated by commas (--store consul)")
	prefix := flag.String("prefix", "roam-chat", "Consul key prefix (--store consul)")
	listen := flag.String("listen", "127.0.0.1:0", "host:port the node's remote listens on")
	name := flag.String("name", "node", "node name, unique among live nodes: what /move names")
	nodes := flag.Int("nodes", 1, "nodes to run in this process (--store memory), named <name>-1.. on consecutive ports")
	verbose := flag.Bool("v", false, "log roam's info events to stderr")
	rooms := flag.Int("rooms", 0, "open this many idle rooms from each node at start (named <node>-room-<i>, placed by load), to try a drain with many units")
	flag.BoolVar(&director, "director", false, "run the placement director with co-location: users' Actors follow their rooms (give every node the flag)")
	flag.StringVar(&tlsDir, "tls-dir", "", "mutual TLS between nodes and clients: a directory with ca.pem and each node's <name>.pem and <name>-key.pem (make certs)")
	flag.BoolVar(&plainTCP, "plain-tcp", false, "listen beyond loopback without TLS: any process that reaches the port is then taken for a node")
	flag.IntVar(&gateway.MaxClients, "max-clients", chat.DefaultMaxClients, "most clients connected to each node's gateway at once; a Connect past it is refused")
	idle := flag.Duration("idle-timeout", chat.DefaultIdleTimeout, "disconnect a client that sent nothing for this long and is in no room or whose inbox is gone (0: never)")
	flag.Parse()
	if gateway.MaxClients <= 0 {
		fmt.Fprintln(os.Stderr, "chat-node: --max-clients must be positive")
		os.Exit(2)
	}
	gateway.IdleTimeout = *idle
	if *idle <= 0 {
		gateway.IdleTimeout = -1 // GatewayOptions' never; its zero is the default
	}
	if err := run(*storeKind, *consulAddr, *prefix, *listen, *name, *nodes, *rooms, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "chat-node:", err)
		os.Exit(1)
	}
}

// director is --director.
var director bool

// tlsDir is --tls-dir, plainTCP --plain-tcp.
var (
	tlsDir   string
	plainTCP bool
)

// gateway is --max-clients and --idle-timeout.
var gateway chat.GatewayOptions

func run(storeKind, consulAddr, prefix, listen, name string, count, rooms int, verbose bool) error {
	level, protoActor := zerolog.WarnLevel, slog.LevelError+4 // Proto.Actor logs a client leaving as an error
	if verbose {
		level, protoActor = zerolog.InfoLevel, slog.LevelWarn
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(level).With().Timestamp().Logger()
	var store location.Store
	switch storeKind {
	case "memory":
		store = memstore.New()
	case "consul":
		s, err := consulstore.New(consulstore.Config{Addresses: consulstore.ParseAddresses(consulAddr), Prefix: prefix})
		if err != nil {
			return err
		}
		store = s
		count = 1
	default:
		return fmt.Errorf("unknown --store %q", storeKind)
	}
	defer store.Close()
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var nodes []*roam.Roam
	for i := 0; i < count; i++ {
		nodeName, nodePort := name, port
		if count > 1 {
			nodeName = fmt.Sprintf("%s-%d", name, i+1)
			if port != 0 {
				nodePort = port + i
			}
		}
		// The application owns the actor system; roam attaches to it. Its
		// gateway lives as long as the system, across roam's node
		// lifecycles (a node whose lease ended starts a new one by itself).
		system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: protoActor}))
		}))
		opts := []roam.Option{roam.WithStore(store), roam.WithNodeName(nodeName), roam.WithAddress(host, nodePort),
			roam.WithKinds(chat.Kinds()...), roam.WithLogger(log), roam.WithTLS(roam.TLSFromDir(tlsDir, nodeName)),
			roam.WithOnEvent(func(e roam.Event) {
				if e.Err == nil && rooms == 0 {
					fmt.Printf("moved %-12s -> %s  pause %.2f ms  %d bytes\n", e.Key.ID, nodeName, float64(e.Pause.Microseconds())/1000, e.Bytes)
				}
			})}
		if director {
			opts = append(opts, roam.WithPlacement(chat.DirectorConfig()))
		}
		if plainTCP {
			opts = append(opts, roam.WithPlainTCP())
		}
		// Each client is a connection of its own: room for them all
		// beside the nodes'.
		opts = append(opts, roam.WithTransportLimits(roam.TransportLimits{MaxConnections: max(1024, gateway.MaxClients+1024)}))
		r, err := roam.New(system, opts...)
		if err != nil {
			return err
		}
		if err := r.Start(ctx); err != nil {
			return err
		}
		defer system.Shutdown()
		defer r.Stop(context.Background())
		if _, _, err := chat.StartGatewayWith(r, log, gateway); err != nil {
			return err
		}
		if err := openRooms(ctx, r, nodeName, rooms); err != nil {
			return err
		}
		fmt.Printf("node %s serving chat at %s\n", nodeName, system.Address())
		nodes = append(nodes, r)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1)
	drainAll := func() {
		for _, r := range nodes {
			fmt.Printf("draining %s\n", r.NodeName())
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			res, err := r.Drain(dctx, roam.DrainOptions{})
			cancel()
			if err != nil {
				fmt.Printf("drain of %s failed: %v\n", r.NodeName(), err)
				continue
			}
			fmt.Printf("drained %s: %d of %d rooms and users moved in %s", r.NodeName(), res.Moved, res.Total, res.Finished.Sub(res.Started).Round(time.Millisecond))
			for _, f := range res.Failed {
				fmt.Printf("; %s stayed: %v", f.Key.ID, f.Err)
			}
			fmt.Println()
		}
	}
	// SIGUSR1 drains and serves on: the node's clients stay connected, its
	// rooms and users' Actors move to the other nodes.
	for s := <-sig; s == syscall.SIGUSR1; s = <-sig {
		drainAll()
	}
	// A rolling deploy's SIGTERM: move every room and user to the other
	// nodes before leaving (a second signal ends at once).
	go func() { <-sig; os.Exit(1) }()
	drainAll()
	fmt.Println("stopping")
	return nil
}

// openRooms creates n idle rooms (roam places each by load), 32 at a
// time, each with one post.
func openRooms(ctx context.Context, r *roam.Roam, node string, n int) error {
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			room := fmt.Sprintf("%s-room-%d", node, i)
			if _, err := r.Spots().GetOrCreate(ctx, room, chat.StableType); err != nil {
				errs <- err
				return
			}
			_, err := r.Spots().Request(ctx, room, &chatpb.Post{Room: room, Name: node, Text: "opened"})
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			return fmt.Errorf("opening rooms: %w", err)
		}
	}
	if n > 0 {
		fmt.Printf("opened %d rooms on %s\n", n, node)
	}
	return nil
}
