package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// grainRow is section (h)'s peer: Proto.Actor's own grain activation, the
// first request to a grain identity nobody has called, on two cluster
// members in this process placed by Proto.Actor's disthash lookup (no
// store: the member list is the test provider's in-memory agent).
type grainRow struct {
	P50  time.Duration // one after another
	Rate float64       // activations/s by callers concurrent callers
}

// grainBlob answers every request with the size roam's blob kind
// answers, so both sides of (h) do the same work per call.
type grainBlob struct{ state []byte }

func (g *grainBlob) Receive(c actor.Context) {
	if m, ok := c.Message().(*wrapperspb.Int64Value); ok {
		if g.state == nil {
			g.state = make([]byte, m.GetValue())
		}
		c.Respond(wrapperspb.Int64(int64(len(g.state))))
	}
}

// grainActivations starts two Proto.Actor cluster members with one grain
// kind, activates n fresh identities one after another from member 0, then
// total more by callers concurrent callers, and stops both members.
func grainActivations(ctx context.Context, run, n, total, callers int) (grainRow, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 4}))
	agent := test.NewInMemAgent()
	kind := cluster.NewKind("blob", actor.PropsFromProducer(func() actor.Actor { return &grainBlob{} }))
	var members []*cluster.Cluster
	defer func() {
		for _, c := range members {
			c.Shutdown(true)
		}
	}()
	for range 2 {
		system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		c := cluster.New(system, cluster.Configure("bench-grains", test.NewTestProvider(agent), disthash.New(),
			remote.Configure("127.0.0.1", 0), cluster.WithKinds(kind), cluster.WithRequestTimeout(30*time.Second)))
		c.StartMember()
		members = append(members, c)
	}
	// Both members must see each other, or every identity hashes to the
	// caller.
	for _, c := range members {
		for c.MemberList.Members().Len() < 2 {
			if err := ctx.Err(); err != nil {
				return grainRow{}, fmt.Errorf("grain baseline: waiting for two members: %w", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	activate := func(id string) error {
		res, err := members[0].Request(id, "blob", wrapperspb.Int64(8))
		if err != nil {
			return fmt.Errorf("grain %s: %w", id, err)
		}
		if v, ok := res.(*wrapperspb.Int64Value); !ok || v.GetValue() != 8 {
			return fmt.Errorf("grain %s answered %v", id, res)
		}
		return nil
	}
	for i := 0; i < 10; i++ { // as (h) warms roam's nodes
		if err := activate(fmt.Sprintf("warm-%d-%d", run, i)); err != nil {
			return grainRow{}, err
		}
	}
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := activate(fmt.Sprintf("cold-%d-%d", run, i)); err != nil {
			return grainRow{}, err
		}
		lat = append(lat, time.Since(start))
	}
	start := time.Now()
	if err := forEach(total, callers, func(i int) error { return activate(fmt.Sprintf("many-%d-%d", run, i)) }); err != nil {
		return grainRow{}, err
	}
	return grainRow{P50: percentile(lat, 0.5), Rate: float64(total) / time.Since(start).Seconds()}, nil
}
