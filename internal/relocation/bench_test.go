package relocation_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// blob holds size bytes of state and answers a request with its length.
type blob struct{ state []byte }

func (b *blob) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.StringValue); ok {
		c.Respond(wrapperspb.Int64(int64(len(b.state))))
	}
}

type blobState struct{ size int }

func (s blobState) Capture(a actor.Actor) ([]byte, error) {
	b := a.(*blob)
	if b.state == nil {
		b.state = make([]byte, s.size)
		for i := range b.state {
			b.state[i] = byte(i)
		}
	}
	return b.state, nil
}

func (blobState) Restore(a actor.Actor, state []byte) error {
	a.(*blob).state = state
	return nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

// BenchmarkPause moves one Actor back and forth between two nodes and
// reports the pause (seal on the source → dispatch open on the target) at
// p50 and p99, beside the p50 of a plain remote request round trip measured
// in the same run, and their ratio.
func BenchmarkPause(b *testing.B) {
	for _, store := range []struct {
		name string
		new  func(testing.TB) location.Store
	}{{"memstore", func(testing.TB) location.Store { return newMemStoreTB() }}, {"consul", newConsulStore}} {
		for _, size := range []int{1 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", store.name, size>>10), func(b *testing.B) {
				benchPause(b, store.new(b), size)
			})
		}
	}
}

func benchPause(b *testing.B, store location.Store, size int) {
	pauses := make(chan time.Duration, 1<<16)
	kind := relocation.Kind{StableType: "blob", Producer: func() actor.Actor { return &blob{} }, Policy: relocation.PreserveStateWith(blobState{size: size})}
	cfg := relocation.Config{OnEvent: func(e relocation.Event) {
		if e.Err == nil {
			pauses <- e.Pause
		}
	}}
	nodes := []*testNode{startNodeConfig(b, store, cfg, kind), startNodeConfig(b, store, cfg, kind)}
	ctx := context.Background()
	key := location.Key(location.KindActor, fmt.Sprintf("blob-%d", size))
	pid, err := nodes[0].driver.Spawn(ctx, "blob", key.ID)
	if err != nil {
		b.Fatal(err)
	}
	// Baseline: remote request round trips from node 1 to the actor on node 0.
	var rtts []time.Duration
	for i := 0; i < 200; i++ {
		start := time.Now()
		if _, err := nodes[1].node.System().Root.RequestFuture(pid, wrapperspb.String("len"), 5*time.Second).Result(); err != nil {
			b.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	var toReady, toCut, toCommit []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		from, to := nodes[i%2], nodes[(i+1)%2]
		out, err := from.driver.Relocate(ctx, key, to.node.Descriptor().GetNodeRid())
		if err != nil {
			b.Fatal(err)
		}
		toReady = append(toReady, out.RelayReady.Sub(out.Sealed))
		toCut = append(toCut, out.CutoverSent.Sub(out.RelayReady))
		toCommit = append(toCommit, out.Committed.Sub(out.CutoverSent))
	}
	b.StopTimer()
	slices.Sort(toReady)
	slices.Sort(toCut)
	slices.Sort(toCommit)
	// Where the time goes, as the source sees it: seal → relay-ready
	// (capture, transfer, restore), relay-ready → cutover sent (the
	// relay), and cutover → commit seen in the store.
	b.ReportMetric(float64(percentile(toReady, 0.5).Microseconds()), "ready-p50-µs")
	b.ReportMetric(float64(percentile(toCut, 0.5).Microseconds()), "cutover-p50-µs")
	b.ReportMetric(float64(percentile(toCommit, 0.5).Microseconds()), "commit-p50-µs")
	b.ReportMetric(float64(percentile(toReady, 0.99).Microseconds())/1000, "ready-p99-ms")
	b.ReportMetric(float64(percentile(toCommit, 0.99).Microseconds())/1000, "commit-p99-ms")
	var ps []time.Duration
	for len(ps) < b.N {
		select {
		case p := <-pauses:
			ps = append(ps, p)
		case <-time.After(10 * time.Second):
			b.Fatalf("%d of %d pause events", len(ps), b.N)
		}
	}
	slices.Sort(ps)
	p50, p99, rtt := percentile(ps, 0.5), percentile(ps, 0.99), percentile(rtts, 0.5)
	b.ReportMetric(float64(p50.Microseconds())/1000, "pause-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "pause-p99-ms")
	b.ReportMetric(float64(rtt.Microseconds())/1000, "rtt-p50-ms")
	b.ReportMetric(float64(p50)/float64(rtt), "pause/rtt")
}

// echo answers every StringValue to its sender with a one-way send.
type echo struct{}

func (echo) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.StringValue); ok && c.Sender() != nil {
		c.Send(c.Sender(), m)
	}
}

// BenchmarkRemoteMessage is the transport's own cost of a message between
// two nodes, the floor under a move's allocations: one round trip of
// one-way sends (two messages, a 32-byte string each) between plain
// actors on two nodes, no roam in their path. A 1 KiB move sends about
// eight messages (docs/PROTOCOL.md §12: source check and its answer,
// Restore request, state chunk, relay-ready, cutover, boundary
// acknowledgement; on Consul the commit notice too).
func BenchmarkRemoteMessage(b *testing.B) {
	store := newMemStoreTB()
	nodes := []*testNode{startNodeConfig(b, store, relocation.Config{}), startNodeConfig(b, store, relocation.Config{})}
	there, err := nodes[0].node.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return echo{} }), "echo")
	if err != nil {
		b.Fatal(err)
	}
	back := make(chan struct{}, 1)
	here := nodes[1].node.System().Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*wrapperspb.StringValue); ok {
			back <- struct{}{}
		}
	}))
	msg := wrapperspb.String("0123456789abcdef0123456789abcdef")
	roundTrip := func() {
		nodes[1].node.System().Root.RequestWithCustomSender(there, msg, here)
		select {
		case <-back:
		case <-time.After(5 * time.Second):
			b.Fatal("no answer in 5 s")
		}
	}
	for range 100 {
		roundTrip()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		roundTrip()
	}
}
