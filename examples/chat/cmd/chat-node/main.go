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

	"github.com/rs/zerolog"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/extension"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/location/consulstore"
	"github.com/roamactors/roam/extension/location/memstore"
	"github.com/roamactors/roam/extension/relocation"
)

func main() {
	storeKind := flag.String("store", "memory", "location store: memory (nodes in this process only) | consul")
	consulAddr := flag.String("consul", "127.0.0.1:8500", "Consul HTTP address, or several agents' addresses separated by commas (--store consul)")
	prefix := flag.String("prefix", "roam-chat", "Consul key prefix (--store consul)")
	listen := flag.String("listen", "127.0.0.1:0", "host:port the node's remote listens on")
	name := flag.String("name", "node", "node name (the Entry Spot prefix; what Relocate names)")
	nodes := flag.Int("nodes", 1, "nodes to run in this process (--store memory), named <name>-1.. on consecutive ports")
	verbose := flag.Bool("v", false, "log roam's info events to stderr")
	tlsDir := flag.String("tls-dir", "", "mutual TLS between nodes and clients: a directory with ca.pem, node.pem and node-key.pem (make certs)")
	flag.Parse()
	if err := run(*storeKind, *consulAddr, *prefix, *listen, *name, *nodes, *verbose, cluster.TLSFromDir(*tlsDir, "node")); err != nil {
		fmt.Fprintln(os.Stderr, "chat-node:", err)
		os.Exit(1)
	}
}

func run(storeKind, consulAddr, prefix, listen, name string, count int, verbose bool, tls *cluster.TLS) error {
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
	for i := 0; i < count; i++ {
		nodeName, nodePort := name, port
		if count > 1 {
			nodeName = fmt.Sprintf("%s-%d", name, i+1)
			if port != 0 {
				nodePort = port + i
			}
		}
		ext, err := extension.Start(ctx, extension.Config{
			// A node whose lease ended rejoins with a new actor system: its
			// gateway starts there again, at the same address (a fixed port).
			OnRejoin: func(e *extension.Extension) {
				if _, err := chat.StartGateway(e, log); err != nil {
					log.Error().Str("event", "gateway_restart_failed").Err(err).Msg("the chat gateway did not start on the new lifecycle")
				}
			},
			Node: cluster.Config{Store: store, Host: host, Port: nodePort, EntryPrefix: nodeName, Logger: &log,
				ProtoActorLogLevel: &protoActor, TLS: tls},
			Kinds: []extension.Kind{chat.Kind()},
			Relocation: relocation.Config{OnEvent: func(e extension.Event) {
				if e.Err == nil {
					fmt.Printf("moved %-12s -> %s  pause %.2f ms  %d bytes\n", e.Key.ID, nodeName, float64(e.Pause.Microseconds())/1000, e.Bytes)
				}
			}},
		})
		if err != nil {
			return err
		}
		defer ext.Stop(context.Background())
		if _, err := chat.StartGateway(ext, log); err != nil {
			return err
		}
		fmt.Printf("node %s serving chat at %s\n", nodeName, ext.Node().Address())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	fmt.Println("stopping")
	return nil
}
