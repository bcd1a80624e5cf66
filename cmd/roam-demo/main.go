// Command roam-demo runs three roam nodes in one process, spawns relocatable
// counters, and moves them between the nodes while senders keep posting
// numbered messages to their original addresses. It prints a line per move
// and a summary, and exits non-zero if any message was lost or duplicated.
// With --store=consul it starts a real Consul (built by `make consul`).
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/extension"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/location/consulstore"
	"github.com/roamactors/roam/extension/location/consulstore/consultest"
	"github.com/roamactors/roam/extension/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

func main() {
	storeKind := flag.String("store", "memory", "location store: memory | consul")
	consulAddr := flag.String("consul", "", "address of a running Consul (with --store=consul); empty starts one")
	moves := flag.Int("moves", 60, "relocations to make")
	flag.Parse()
	if err := run(*storeKind, *consulAddr, *moves); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// counter counts numbered messages per sender and notices repeats and gaps.
type counter struct {
	last    [4]uint32
	handled uint64
	dupes   uint64
	gaps    uint64
}

func (c *counter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *wrapperspb.UInt64Value:
		sender, seq := m.Value>>32, uint32(m.Value)
		switch {
		case seq <= c.last[sender]:
			c.dupes++
		case seq != c.last[sender]+1:
			c.gaps++
		}
		c.last[sender] = max(c.last[sender], seq)
		c.handled++
	case *wrapperspb.StringValue:
		b := binary.BigEndian.AppendUint64(nil, c.handled)
		b = binary.BigEndian.AppendUint64(b, c.dupes)
		ctx.Respond(wrapperspb.Bytes(binary.BigEndian.AppendUint64(b, c.gaps)))
	}
}

type counterState struct{}

func (counterState) Capture(a actor.Actor) ([]byte, error) {
	c := a.(*counter)
	b := binary.BigEndian.AppendUint64(nil, c.handled)
	b = binary.BigEndian.AppendUint64(b, c.dupes)
	b = binary.BigEndian.AppendUint64(b, c.gaps)
	for _, l := range c.last {
		b = binary.BigEndian.AppendUint32(b, l)
	}
	return b, nil
}

func (counterState) Restore(a actor.Actor, b []byte) error {
	if len(b) != 40 {
		return errors.New("bad counter state")
	}
	c := a.(*counter)
	c.handled, c.dupes, c.gaps = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
	for i := range c.last {
		c.last[i] = binary.BigEndian.Uint32(b[24+4*i:])
	}
	return nil
}

func run(storeKind, consulAddr string, moves int) error {
	ctx := context.Background()
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
		s, err := consulstore.New(consulstore.Config{Address: consulAddr, Prefix: fmt.Sprintf("roam-demo/%d", time.Now().UnixNano())})
		if err != nil {
			return err
		}
		store = s
	default:
		return fmt.Errorf("unknown --store %q", storeKind)
	}
	defer store.Close()

	var nodes []*extension.Extension
	for i := 0; i < 3; i++ {
		n, err := extension.Start(ctx, extension.Config{Node: cluster.Config{Store: store}})
		if err != nil {
			return err
		}
		defer n.Stop(ctx)
		if err := n.RegisterKind(extension.Kind{StableType: "counter", Producer: func() actor.Actor { return &counter{} },
			Policy: extension.PreserveStateWith(counterState{})}); err != nil {
			return err
		}
		nodes = append(nodes, n)
		fmt.Printf("node %d  %s  rid=%s  entry=%s\n", i, n.Node().Address(), n.NodeRid(), n.Node().EntrySpotID())
	}
	byRid := map[string]int{}
	for i, n := range nodes {
		byRid[n.NodeRid()] = i
	}

	const objects, senders = 5, 4
	pids := make([]*actor.PID, objects)
	for o := range pids {
		pid, err := nodes[o%3].SpawnActor(ctx, "counter", fmt.Sprintf("counter-%d", o))
		if err != nil {
			return err
		}
		pids[o] = pid
	}

	// Senders post numbered messages while the counters move. Each round is
	// five sends and one request on the same route; the answer means the
	// sends before it were handled, so the route may then be refreshed from
	// the store without overtaking them (Message Follow carries the rest).
	var sent atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			home := nodes[s%3]
			root := home.System().Root
			var seq [objects]uint32
			routes := make([]*actor.PID, objects)
			copy(routes, pids)
			for round := 0; ; round++ {
				for o := range routes {
					select {
					case <-stop:
						return
					default:
					}
					for i := 0; i < 5; i++ {
						seq[o]++
						root.Send(routes[o], wrapperspb.UInt64(uint64(s)<<32|uint64(seq[o])))
						sent.Add(1)
					}
					if _, err := root.RequestFuture(routes[o], wrapperspb.String("stats"), 10*time.Second).Result(); err != nil {
						errs <- err
						return
					}
					if round%3 == 2 {
						pid, err := home.Resolve(ctx, extension.ActorRef(fmt.Sprintf("counter-%d", o)))
						if err != nil {
							errs <- err
							return
						}
						routes[o] = pid
					}
				}
			}
		}(s)
	}

	r := rand.New(rand.NewPCG(1, 2))
	var pauses []time.Duration
	for m := 0; m < moves; m++ {
		o := r.IntN(objects)
		ref := extension.ActorRef(fmt.Sprintf("counter-%d", o))
		v, err := store.Read(ctx, ref)
		if err != nil {
			return err
		}
		from := byRid[v.Record.GetOwner().GetNodeRid()]
		to := (from + 1 + r.IntN(2)) % 3
		out, err := nodes[from].Relocate(ctx, ref, nodes[to].NodeRid())
		if errors.Is(err, roamerr.ErrUnavailable) {
			m--
			continue
		}
		if err != nil {
			return err
		}
		pauses = append(pauses, out.Pause)
		fmt.Printf("move %3d  %-10s node %d -> node %d  pause %6.2f ms  %d bytes\n", m+1, ref.ID, from, to, float64(out.Pause.Microseconds())/1000, out.Bytes)
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("sender: %w", err)
	default:
	}

	var handled, dupes, gaps uint64
	for o := range pids {
		pid, err := nodes[0].Resolve(ctx, extension.ActorRef(fmt.Sprintf("counter-%d", o)))
		if err != nil {
			return err
		}
		res, err := nodes[0].System().Root.RequestFuture(pid, wrapperspb.String("stats"), 10*time.Second).Result()
		if err != nil {
			return err
		}
		b := res.(*wrapperspb.BytesValue).Value
		handled += binary.BigEndian.Uint64(b)
		dupes += binary.BigEndian.Uint64(b[8:])
		gaps += binary.BigEndian.Uint64(b[16:])
	}
	slices.Sort(pauses)
	lost := sent.Load() - (handled - dupes)
	fmt.Printf("\nmoves %d, messages sent %d, handled %d, lost %d, duplicated %d, out of order %d\n", len(pauses), sent.Load(), handled, lost, dupes, gaps)
	fmt.Printf("pause p50 %.2f ms, p99 %.2f ms, max %.2f ms (seal on the source -> commit seen in the store)\n",
		ms(pauses[len(pauses)/2]), ms(pauses[min(len(pauses)-1, len(pauses)*99/100)]), ms(pauses[len(pauses)-1]))
	if lost != 0 || dupes != 0 {
		return fmt.Errorf("lost=%d duplicated=%d", lost, dupes)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
