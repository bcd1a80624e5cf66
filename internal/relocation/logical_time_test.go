package relocation_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// hourly registers an hourly framework timer and counts its ticks, and
// the ticks that broke the schedule: a delivery index that is not the
// next, or a slot that is not a whole number of hours after the first.
type hourly struct {
	ticks, broken uint64
	first, last   int64 // scheduled Unix ms of the first and the last tick
}

func (h *hourly) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.StringValue:
		if m.Value == "start" {
			ts, err := relocation.Timers(c)
			if err != nil {
				panic(err)
			}
			if err := ts.Every("hour", time.Hour); err != nil {
				panic(err)
			}
		}
		c.Respond(wrapperspb.UInt64(h.ticks<<32 | h.broken))
	case *messages.TimerTick:
		at := m.GetScheduledUnixMillis()
		if h.ticks == 0 {
			h.first = at
		}
		if m.GetDeliveryIndex() != h.ticks+1 || at != h.first+int64(h.ticks)*time.Hour.Milliseconds() {
			h.broken++
		}
		h.ticks++
		h.last = at
	}
}

type hourlyState struct{}

func (hourlyState) Capture(a actor.Actor) ([]byte, error) {
	h := a.(*hourly)
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(
		binary.BigEndian.AppendUint64(nil, h.ticks), h.broken), uint64(h.first)), uint64(h.last)), nil
}

func (hourlyState) Restore(a actor.Actor, b []byte) error {
	h := a.(*hourly)
	h.ticks, h.broken = binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	h.first, h.last = int64(binary.BigEndian.Uint64(b[16:])), int64(binary.BigEndian.Uint64(b[24:]))
	return nil
}

// A framework timer keeps its schedule across moves in logical time: with
// both nodes on one manual clock, an hourly timer ticks exactly once per
// hour the test advances, never before its hour, on its slot, and its
// indexes go on after each move. On the real clock this takes hours; it can
// be checked because a node's time is an input (machine.Clock): the
// nodes' leases run on the same clock.
// Reference: docs/PROTOCOL.md §5.5 (framework timers that move).
func TestTimersKeepTheirScheduleInLogicalTime(t *testing.T) {
	clock := machine.NewManualAt(time.Now())
	store := newStore(t)
	kind := relocation.Kind{StableType: "hourly", Producer: func() actor.Actor { return &hourly{} },
		Policy: relocation.PreserveStateWith(hourlyState{})}
	// An hour-long lease, renewed every 20 minutes of the clock, which the
	// test advances 5 minutes at a time, letting the nodes settle.
	start := func() *testNode {
		return startMeshNode(t, meshnode.Config{Store: store, Logger: testLogger(), Clock: clock, LeaseTTL: time.Hour},
			relocation.Config{Logger: testLogger()}, kind)
	}
	nodes := []*testNode{start(), start()}
	advance := func(d time.Duration) {
		testwait.Advance(t, clock, d, 5*time.Minute, nodes[0].node.Settled, nodes[1].node.Settled)
	}
	ctx := context.Background()
	key := location.Key(location.KindActor, "hourly")
	pid, err := nodes[0].driver.Spawn(ctx, "hourly", key.ID)
	require.NoError(t, err)
	sys := nodes[0].node.System()
	ask(t, sys, pid, "start")
	stats := func() (ticks, broken uint64) {
		p, err := nodes[0].driver.Resolve(ctx, key)
		require.NoError(t, err)
		v := ask(t, sys, p, "stats").(*wrapperspb.UInt64Value).Value
		return v >> 32, v & 0xffffffff
	}

	var want uint64
	hour := func() {
		t.Helper()
		advance(59 * time.Minute)
		ticks, _ := stats()
		require.Equal(t, want, ticks, "a tick came before its hour")
		advance(time.Minute)
		want++
		testwait.Within(t, 10*time.Second, func() bool { n, _ := stats(); return n >= want }, "the tick of the hour")
		ticks, broken := stats()
		require.Equal(t, want, ticks, "one tick per hour")
		require.Zero(t, broken, "every tick on its slot, delivery indexes contiguous")
	}
	for i := 0; i < 4; i++ {
		hour()
		hour()
		_, err := nodes[i%2].driver.Relocate(ctx, key, nodes[(i+1)%2].node.Descriptor().GetNodeRid())
		require.NoError(t, err)
	}
	hour()
	require.Equal(t, uint64(9), want)
}

// firstReadFails answers the first read of one object's record
// Unavailable, and counts the reads of it.
type firstReadFails struct {
	location.Store
	key   location.AuthorityKey
	reads atomic.Int32
}

func (s *firstReadFails) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key == s.key && s.reads.Add(1) == 1 {
		return location.Versioned{}, location.ErrUnavailable
	}
	return s.Store.Read(ctx, key)
}

// A target's check of the source that met an unavailable store tries
// again after handoff.FirstVerifyWait of the node's clock: in logical time
// the retry waits for the test to advance the clock by that pause, and
// comes then — the source check before the seal as VerifySource after the
// Restore request (a target without the check).
// Reference: docs/PROTOCOL.md §5.2, §5.7 (VerifySource).
func TestVerifySourceRetriesOnTheNodesClock(t *testing.T) {
	for _, checkFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("source check before the seal %v", checkFirst), func(t *testing.T) {
			clock := machine.NewManualAt(time.Now())
			shared := newStore(t)
			key := location.Key(location.KindActor, "verified")
			st := &firstReadFails{Store: shared, key: key}
			cfg := relocation.Config{Logger: testLogger()}
			a := startMeshNode(t, meshnode.Config{Store: shared, Logger: testLogger(), Clock: clock, LeaseTTL: time.Hour}, cfg, counterKind)
			b := startMeshNode(t, meshnode.Config{Store: st, Logger: testLogger(), Clock: clock, LeaseTTL: time.Hour}, cfg, counterKind)
			if !checkFirst {
				relocation.WithoutSourceCheck(b.driver)
			}
			ctx := context.Background()
			_, err := a.driver.Spawn(ctx, "counter", key.ID)
			require.NoError(t, err)
			moved := make(chan error, 1)
			go func() {
				_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
				moved <- err
			}()
			start := clock.Now()
			testwait.For(t, func() bool {
				next, ok := clock.Next()
				return st.reads.Load() == 1 && ok && next.Equal(start.Add(handoff.FirstVerifyWait))
			}, "the check's first read failed and its retry waits on the node's clock")
			clock.Advance(handoff.FirstVerifyWait)
			testwait.For(t, func() bool { return st.reads.Load() >= 2 }, "the check read again once its pause passed on the clock")
			require.NoError(t, testwait.Recv(t, moved, "the move committed"))
			want := 0
			if checkFirst {
				want = 1
			}
			require.Equal(t, want, relocation.PrecheckedRestores(b.driver))
		})
	}
}
