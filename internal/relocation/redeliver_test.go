package relocation_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// tally counts every BytesValue it receives, whatever its content, and
// answers a request (StringValue "get") with the count: one message value
// sent many times counts each send.
type tally struct{ count int64 }

func (t *tally) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *wrapperspb.BytesValue:
		t.count++
	case *wrapperspb.StringValue:
		ctx.Respond(wrapperspb.Int64(t.count))
	}
}

type tallyState struct{}

func (tallyState) Capture(a actor.Actor) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(a.(*tally).count)), nil
}

func (tallyState) Restore(a actor.Actor, state []byte) error {
	if len(state) != 8 {
		return errors.New("bad tally state")
	}
	a.(*tally).count = int64(binary.BigEndian.Uint64(state))
	return nil
}

var tallyKind = relocation.Kind{
	StableType: "tally",
	Producer:   func() actor.Actor { return &tally{} },
	Policy:     relocation.PreserveStateWith(tallyState{}),
}

// A send's dead-letter redelivery is counted per send, not per message
// value: an application that sends one message value (one pointer) again
// makes a new send, with its own patience. Here the second send of a value
// goes to a gone incarnation more than the patience after the first one
// did; it is redelivered like the first, not failed as a send whose
// patience ran out.
func TestOneMessageValueSentAgainIsANewSendForDeadLetters(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	cfg := shortFollow(logs.logger())
	a := startNodeConfig(t, store, cfg, tallyKind)
	b := startNodeConfig(t, store, cfg, tallyKind)
	const patience = 2 * time.Second
	a.driver.SetDeadLetterPatience(patience)
	ctx := context.Background()
	key := location.Key(location.KindActor, "same-value")
	old, err := a.driver.Spawn(ctx, "tally", key.ID)
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	now, err := a.driver.Resolve(ctx, key)
	require.NoError(t, err)
	sys := a.node.System()
	waitDeadLetter(t, sys, old) // the stub on a is gone: a send to it dead-letters on a

	msg := wrapperspb.Bytes([]byte("same"))
	sys.Root.Send(old, msg)
	waitCount(t, b.node.System(), now, 1)
	// The first send dead-lettered before this instant; wait until the
	// patience has passed since (but not twice over, when the old
	// bookkeeping would be swept).
	handled := time.Now()
	deadline := time.Now().Add(testwait.Patience(t))
	for time.Since(handled) <= patience {
		require.True(t, time.Now().Before(deadline))
		time.Sleep(20 * time.Millisecond)
	}
	sys.Root.Send(old, msg)
	for get(t, b.node.System(), now) != 2 {
		require.False(t, logs.has("send_dead_letter"), "the second send was failed as the first one's redelivery")
		require.True(t, time.Now().Before(deadline), "the second send never arrived")
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, logs.has("send_dead_letter"))
}

// A dead-lettered send still waiting for its redelivery when the node
// stops ends loudly: logged as send_dead_letter with the reason "node
// stopped" and counted once, never dropped silently. The store names an
// incarnation on the node that does not exist, so the send dead-letters on
// every try and waits with a growing back-off.
func TestPendingRedeliveryFailsLoudlyWhenTheNodeStops(t *testing.T) {
	store := newStore(t)
	a, logs, reader := observedNode(t, store, tallyKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "pending")
	_, err := a.driver.Spawn(ctx, "tally", key.ID)
	require.NoError(t, err)
	v, err := store.Read(ctx, key)
	require.NoError(t, err)
	rec := proto.Clone(v.Record).(*location.Record)
	rec.AuthorityOwnerGeneration++ // an incarnation on a that does not exist
	_, err = store.CompareAndSet(ctx, key, v.Version, rec)
	require.NoError(t, err)

	sys := a.node.System()
	sys.Root.Send(actor.NewPID(a.node.Address(), "roam/actor/"+key.ID+"@0.0"), wrapperspb.Bytes([]byte("pending")))
	testwait.For(t, func() bool { return logs.has("dead_letter_reresolved") }, "the send was never taken for redelivery")
	require.NoError(t, a.node.Stop(ctx))
	testwait.For(t, func() bool { return logs.hasLine("send_dead_letter", `"reason":"node stopped"`) }, "the pending send vanished at stop")
	require.EqualValues(t, 1, undelivered(t, reader, "send_dead_letter"))
}

// observedNode starts a node whose log lines and metrics the test reads.
func observedNode(t *testing.T, store location.Store, kinds ...relocation.Kind) (*testNode, *logBuffer, *sdkmetric.ManualReader) {
	t.Helper()
	logs := &logBuffer{}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	return startNodeConfig(t, store, relocation.Config{Logger: logs.logger(), MeterProvider: provider}, kinds...), logs, reader
}

// undelivered is the sends_undelivered count for one reason.
func undelivered(t *testing.T, reader *sdkmetric.ManualReader, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "roam.relocation.sends_undelivered" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if r, _ := dp.Attributes.Value("reason"); r.AsString() == reason {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// A followed send that reaches an incarnation of another ObjectGeneration
// is not run (docs/PROTOCOL.md §5.14) and not dropped silently: it is logged and
// counted as send_invalid_generation.
func TestASendForAnotherGenerationIsCounted(t *testing.T) {
	store := newStore(t)
	a, logs, reader := observedNode(t, store, tallyKind)
	pid, err := a.driver.Spawn(context.Background(), "tally", "elsewhen")
	require.NoError(t, err)
	env := &actor.MessageEnvelope{Message: wrapperspb.Bytes([]byte("stray"))}
	env.SetHeader(relocation.HeaderGeneration, "99")
	a.node.System().Root.Send(pid, env)
	testwait.For(t, func() bool { return undelivered(t, reader, "send_invalid_generation") > 0 }, "the send for another generation vanished")
	// The count and the log line are two steps: wait for the second too.
	testwait.For(t, func() bool { return logs.has("send_invalid_generation") }, "the send for another generation was not logged")
}

// A one-way send to the PID of an Actor deleted and spawned again under
// its ID is not taken by the new incarnation: its dead letter is
// redelivered with the generation the PID named, which the new one
// refuses, counted and logged (docs/PROTOCOL.md §2.3).
func TestASendToADeletedActorDoesNotReachItsNextIncarnation(t *testing.T) {
	store := newStore(t)
	a, logs, reader := observedNode(t, store, tallyKind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "again")
	old, err := a.driver.Spawn(ctx, "tally", key.ID)
	require.NoError(t, err)
	deleted, err := a.driver.DeleteActor(ctx, key)
	require.NoError(t, err)
	require.True(t, deleted)
	now, err := a.driver.Spawn(ctx, "tally", key.ID)
	require.NoError(t, err)
	require.NotEqual(t, old.Id, now.Id)
	a.node.System().Root.Send(old, wrapperspb.Bytes([]byte("for the deleted one")))
	testwait.For(t, func() bool { return undelivered(t, reader, "send_invalid_generation") > 0 }, "the send to the deleted incarnation vanished")
	testwait.For(t, func() bool { return logs.has("send_invalid_generation") }, "the refused send was not logged")
	require.Zero(t, get(t, a.node.System(), now), "the new incarnation took a send made to the deleted one")
}
