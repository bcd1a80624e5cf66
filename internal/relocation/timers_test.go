package relocation_test

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// ticker registers a framework timer when told to and records the ticks:
// how many, the last delivery index, and gaps or repeats in the indexes.
type ticker struct {
	ticks, last, broken uint64
}

func (k *ticker) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.StringValue:
		ts, err := relocation.Timers(c)
		if err != nil {
			panic(err)
		}
		switch m.Value {
		case "start":
			if err := ts.Every("beat", 10*time.Millisecond); err != nil {
				panic(err)
			}
			c.Respond(wrapperspb.String("ok"))
		case "names":
			c.Respond(wrapperspb.String(strings.Join(ts.Names(), ",")))
		case "stats":
			c.Respond(wrapperspb.UInt64(k.last<<32 | k.broken))
		}
	case *messages.TimerTick:
		if m.DeliveryIndex != k.last+1 {
			k.broken++
		}
		k.last = m.DeliveryIndex
		k.ticks++
	}
}

type tickerState struct{}

func (tickerState) Capture(a actor.Actor) ([]byte, error) {
	k := a.(*ticker)
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b, k.ticks)
	binary.BigEndian.PutUint64(b[8:], k.last)
	binary.BigEndian.PutUint64(b[16:], k.broken)
	return b, nil
}

func (tickerState) Restore(a actor.Actor, b []byte) error {
	k := a.(*ticker)
	k.ticks, k.last, k.broken = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:])
	return nil
}

var tickerKind = relocation.Kind{StableType: "ticker", Producer: func() actor.Actor { return &ticker{} }, Policy: relocation.PreserveStateWith(tickerState{})}

func ask(t *testing.T, sys *actor.ActorSystem, pid *actor.PID, q string) any {
	t.Helper()
	res, err := sys.Root.RequestFuture(pid, wrapperspb.String(q), 10*time.Second).Result()
	require.NoError(t, err)
	require.NoError(t, relocation.DeliveryError(res))
	return res
}

// A framework timer moves with its actor: after several moves the ticks go
// on with contiguous delivery indexes, and the application never registers
// the timer again.
// Reference: docs/PROTOCOL.md §5.5 (framework timers that move).
func TestTimersMoveWithTheActor(t *testing.T) {
	store := newStore(t)
	a, b := startNodeWith(t, store, tickerKind), startNodeWith(t, store, tickerKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "tick")
	pid, err := a.driver.Spawn(ctx, "ticker", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	ask(t, sys, pid, "start")

	waitTicks := func(min uint64) uint64 {
		deadline := time.Now().Add(testwait.Patience(t))
		for {
			p, err := a.driver.Resolve(ctx, key)
			require.NoError(t, err)
			v := ask(t, sys, p, "stats").(*wrapperspb.UInt64Value).Value
			require.Zero(t, v&0xffffffff, "delivery indexes must be contiguous")
			if last := v >> 32; last >= min {
				return last
			}
			require.True(t, time.Now().Before(deadline), "ticks stopped at %d", v>>32)
			time.Sleep(5 * time.Millisecond)
		}
	}
	last := waitTicks(3)
	nodes := []*testNode{a, b}
	for i := 0; i < 6; i++ {
		_, err := nodes[i%2].driver.Relocate(ctx, key, nodes[(i+1)%2].node.Descriptor().GetNodeRid())
		require.NoError(t, err)
		last = waitTicks(last + 3)
	}
	p, err := a.driver.Resolve(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "beat", ask(t, sys, p, "names").(*wrapperspb.StringValue).Value)
}
