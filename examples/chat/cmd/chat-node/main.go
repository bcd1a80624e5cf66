// Command chat-node runs chat rooms on a roam node and serves chat clients
// through its gateway. SIGTERM drains the node and stops it, SIGUSR1
// drains it and serves on; a wrong flag exits 2, naming what it accepts.
//
//	chat-node --store consul --consul 127.0.0.1:8500 --listen 127.0.0.1:7001 --name node-a
//	chat-node --store consul --consul 10.0.0.1:8500,10.0.0.2:8500 ...  # outlives either agent
//	chat-node --store memory --nodes 3 --listen 127.0.0.1:7001 --name node   # node-1..3 in one process
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

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
	c, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		if !errors.As(err, new(parseError)) {
			fmt.Fprintln(os.Stderr, "chat-node:", err)
		}
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "chat-node:", err)
		os.Exit(1)
	}
}

// config is the command's flags, checked.
type config struct {
	store, consul, prefix, listen, name string
	host                                string
	port                                int
	nodes, rooms                        int
	verbose, director, plainTCP         bool
	tlsDir                              string
	gateway                             chat.GatewayOptions // --max-clients and --idle-timeout
}

// The flags' bounds: past them a node would not start, or run out of
// ports or memory on the way.
const (
	maxNodes      = 64        // --nodes: each node has an actor system, a remote and two ports
	maxRooms      = 1_000_000 // --rooms: each an idle Spot with one post
	maxMaxClients = 1_000_000 // --max-clients: each client may hold a connection
	// maxNameBytes leaves room in a node's name for the -<i> of --nodes.
	maxNameBytes = location.MaxIDBytes - len("-64")
)

// parseFlags parses and checks every flag, so that a wrong one stops the
// command before any node starts, saying what it accepts.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("chat-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.store, "store", "memory", "location store: memory (nodes in this process only) | consul")
	fs.StringVar(&c.consul, "consul", "127.0.0.1:8500", "Consul HTTP address, or several agents' addresses separated by commas (--store consul)")
	fs.StringVar(&c.prefix, "prefix", "roam-chat", "Consul key prefix (--store consul)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "host:port the node's remote listens on (port 0: any free port)")
	fs.StringVar(&c.name, "name", "node", "node name, unique among live nodes: what /move names")
	fs.IntVar(&c.nodes, "nodes", 1, fmt.Sprintf("nodes to run in this process (--store memory; 1 to %d), named <name>-1.. on consecutive ports", maxNodes))
	fs.BoolVar(&c.verbose, "v", false, "log roam's info events to stderr")
	fs.IntVar(&c.rooms, "rooms", 0, fmt.Sprintf("open this many idle rooms from each node at start (0 to %d; named <node>-room-<i>, placed by load), to try a drain with many units", maxRooms))
	fs.BoolVar(&c.director, "director", false, "run the placement director with co-location: users' Actors follow their rooms (give every node the flag)")
	fs.StringVar(&c.tlsDir, "tls-dir", "", "mutual TLS between nodes and clients: a directory with ca.pem and each node's <name>.pem and <name>-key.pem (make certs)")
	fs.BoolVar(&c.plainTCP, "plain-tcp", false, "listen beyond loopback without TLS: any process that reaches the port is then taken for a node")
	fs.IntVar(&c.gateway.MaxClients, "max-clients", chat.DefaultMaxClients, fmt.Sprintf("most clients connected to each node's gateway at once (1 to %d); a Connect past it is refused", maxMaxClients))
	idle := fs.Duration("idle-timeout", chat.DefaultIdleTimeout, "disconnect a client that sent nothing for this long and is in no room or whose inbox is gone (0: never)")
	if err := fs.Parse(args); err != nil {
		return c, parseError{err} // printed by the flag package, with the flags
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: every option is a flag (-h lists them)", fs.Arg(0))
	}
	switch c.store {
	case "memory":
	case "consul":
		for _, a := range consulstore.ParseAddresses(c.consul) {
			_, hostPort, ok := strings.Cut(a, "://")
			if !ok {
				hostPort = a
			}
			if host, _, err := net.SplitHostPort(hostPort); err != nil || host == "" {
				return c, fmt.Errorf("--consul must name at least one Consul agent, each host:port (http:// or https:// before it if need be), several separated by commas; got %q", c.consul)
			}
		}
		if c.prefix == "" {
			return c, errors.New("--prefix must not be empty: the nodes' keys live under it")
		}
		if c.nodes != 1 {
			return c, fmt.Errorf("--nodes must be 1 with --store consul (run one process per node), got %d", c.nodes)
		}
	default:
		return c, fmt.Errorf("--store must be memory or consul, got %q", c.store)
	}
	if c.nodes < 1 || c.nodes > maxNodes {
		return c, fmt.Errorf("--nodes must be from 1 to %d, got %d", maxNodes, c.nodes)
	}
	host, portText, err := net.SplitHostPort(c.listen)
	port, perr := strconv.Atoi(portText)
	if err != nil || host == "" || perr != nil || port < 0 || port > 65535 {
		return c, fmt.Errorf("--listen must be host:port with a port from 0 to 65535 (0: any free port), got %q", c.listen)
	}
	if port != 0 && port+c.nodes-1 > 65535 {
		return c, fmt.Errorf("--listen's port must be at most %d for --nodes %d (one port each from it), got %d", 65535-c.nodes+1, c.nodes, port)
	}
	c.host, c.port = host, port
	if c.name == "" || len(c.name) > maxNameBytes || !utf8.ValidString(c.name) {
		return c, fmt.Errorf("--name must be UTF-8 of 1 to %d bytes, got %d bytes", maxNameBytes, len(c.name))
	}
	if c.rooms < 0 || c.rooms > maxRooms {
		return c, fmt.Errorf("--rooms must be from 0 to %d, got %d", maxRooms, c.rooms)
	}
	if c.gateway.MaxClients < 1 || c.gateway.MaxClients > maxMaxClients {
		return c, fmt.Errorf("--max-clients must be from 1 to %d, got %d", maxMaxClients, c.gateway.MaxClients)
	}
	if *idle < 0 {
		return c, fmt.Errorf("--idle-timeout must be 0 (never) or more, got %s", *idle)
	}
	c.gateway.IdleTimeout = *idle
	if *idle == 0 {
		c.gateway.IdleTimeout = -1 // GatewayOptions' never; its zero is the default
	}
	if c.tlsDir != "" {
		if st, err := os.Stat(c.tlsDir); err != nil || !st.IsDir() {
			return c, fmt.Errorf("--tls-dir must be a directory with ca.pem and each node's <name>.pem and <name>-key.pem (make certs), got %q", c.tlsDir)
		}
	}
	return c, nil
}

func run(c config) error {
	level, protoActor := zerolog.WarnLevel, slog.LevelError+4 // Proto.Actor logs a client leaving as an error
	if c.verbose {
		level, protoActor = zerolog.InfoLevel, slog.LevelWarn
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(level).With().Timestamp().Logger()
	var store location.Store
	if c.store == "consul" {
		s, err := consulstore.New(consulstore.Config{Addresses: consulstore.ParseAddresses(c.consul), Prefix: c.prefix})
		if err != nil {
			return err
		}
		store = s
	} else {
		store = memstore.New()
	}
	defer store.Close()
	name, host, port, count, rooms, tlsDir, gateway := c.name, c.host, c.port, c.nodes, c.rooms, c.tlsDir, c.gateway
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
		if c.director {
			opts = append(opts, roam.WithPlacement(chat.DirectorConfig()))
		}
		if c.plainTCP {
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

// parseError is a flag the flag package could not parse: it has printed
// the error and the flags already.
type parseError struct{ error }

func (e parseError) Unwrap() error { return e.error }
