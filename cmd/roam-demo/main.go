// Command roam-demo shows what roam does so far: three nodes in one process
// claim their descriptors and Entry Spots in the Location Store under owner
// leases, talk over Proto.Actor remote, compete for one Spot record by
// compare-and-set, and leave nothing behind when they stop. With
// --store=consul it starts a real Consul (built by `make consul`) and uses it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/location/consulstore"
	"github.com/roamactors/roam/extension/location/consulstore/consultest"
	"github.com/roamactors/roam/extension/location/memstore"
	"github.com/roamactors/roam/messages"
)

func main() {
	storeKind := flag.String("store", "memory", "location store: memory | consul")
	consulAddr := flag.String("consul", "", "address of a running Consul (with --store=consul); empty starts one")
	verbose := flag.Bool("v", false, "log node events")
	flag.Parse()
	if err := run(*storeKind, *consulAddr, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type echo struct{}

func (echo) Receive(c actor.Context) {
	if m, ok := c.Message().(*messages.NodeDescriptor); ok {
		c.Respond(m)
	}
}

func run(storeKind, consulAddr string, verbose bool) error {
	ctx := context.Background()
	logger := zerolog.Nop()
	if verbose {
		logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
	}

	var store location.Store
	switch storeKind {
	case "memory":
		store = memstore.New()
	case "consul":
		if consulAddr == "" {
			srv, err := consultest.Launch()
			if err != nil {
				return err
			}
			defer srv.Stop()
			consulAddr = srv.Addr
			fmt.Printf("started Consul %s at %s\n", consultest.Version, consulAddr)
		}
		s, err := consulstore.New(consulstore.Config{Address: consulAddr, Prefix: "roam-demo"})
		if err != nil {
			return err
		}
		store = s
	default:
		return fmt.Errorf("unknown --store %q", storeKind)
	}
	defer store.Close()

	var nodes []*cluster.Node
	for i := 0; i < 3; i++ {
		n, err := cluster.Start(ctx, cluster.Config{Store: store, StableTypes: []string{"room"}, LeaseTTL: 5 * time.Second, Logger: &logger})
		if err != nil {
			return err
		}
		defer n.Stop(ctx)
		nodes = append(nodes, n)
		fmt.Printf("node %d  address=%s  entry=%s  lease=%s\n", i, n.Address(), n.EntrySpotID(), n.Lease().ID)
	}

	listed, err := store.ListNodes(ctx, cluster.DefaultMesh)
	if err != nil {
		return err
	}
	fmt.Printf("store lists %d node descriptors\n", len(listed))

	// A request from node 0 to an actor on node 2, over the remote.
	if _, err := nodes[2].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return echo{} }), "echo"); err != nil {
		return err
	}
	start := time.Now()
	if _, err := nodes[0].System().Root.RequestFuture(actor.NewPID(nodes[2].Address(), "echo"), nodes[0].Descriptor(), 5*time.Second).Result(); err != nil {
		return fmt.Errorf("remote request: %w", err)
	}
	fmt.Printf("node 0 -> node 2 remote request answered in %s\n", time.Since(start).Round(time.Microsecond))

	// Three nodes race to own one Spot: exactly one compare-and-set wins.
	key := location.Key(location.KindInstanceSpot, "room/lobby 🚀")
	var wg sync.WaitGroup
	results := make([]error, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func(i int, n *cluster.Node) {
			defer wg.Done()
			d := n.Descriptor()
			_, results[i] = store.CompareAndSet(ctx, key, 0, &location.Record{
				ObjectGeneration: 1, AuthorityOwnerGeneration: 1,
				State: messages.LifecycleState_LIFECYCLE_STATE_READY, StableType: "room",
				SpotKind: messages.SpotKind_SPOT_KIND_INSTANCE,
				Owner:    &messages.Owner{Mesh: d.GetMesh(), NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), LeaseId: d.GetLeaseId()},
			})
		}(i, n)
	}
	wg.Wait()
	winners := 0
	for i, err := range results {
		switch {
		case err == nil:
			winners++
			fmt.Printf("node %d won the claim of %q\n", i, key.ID)
		case errors.Is(err, location.ErrConflict):
			fmt.Printf("node %d lost the claim of %q (conflict)\n", i, key.ID)
		default:
			return err
		}
	}
	if winners != 1 {
		return fmt.Errorf("%d winners for one Spot", winners)
	}

	for i, n := range nodes {
		if err := n.Stop(ctx); err != nil {
			return err
		}
		fmt.Printf("node %d stopped and released its claim\n", i)
	}
	left, err := store.ListNodes(ctx, "")
	if err != nil {
		return err
	}
	fmt.Printf("store lists %d node descriptors after stop\n", len(left))
	if len(left) != 0 {
		return fmt.Errorf("%d descriptors left behind", len(left))
	}
	fmt.Println("ok: relocation (moving a Spot between nodes) is not built yet; see README")
	return nil
}
