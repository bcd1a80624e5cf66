package relocation_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/internal/testwait"
)

// Cutting the Proto.Actor endpoint to the target right after the cutover
// makes the source resend the whole boundary batch and the cutover on a new
// connection; the target takes nothing twice (a matched batch is not
// merged again; a fallback skips the prefix it has) and logs late_cutover.
// Reference: spec 000 §4.4, §9 (cutover lost, source running), §13.
func TestConnectionLossResendsTheBoundaryBatch(t *testing.T) {
	store := newStore(t)
	logs := &logBuffer{}
	kind := relocation.Kind{StableType: "ledger", Producer: func() actor.Actor { return newLedger() }, Policy: relocation.PreserveStateWith(ledgerState{})}
	a := startNodeWith(t, store, kind)
	b := startNodeConfig(t, store, relocation.Config{Logger: logs.logger()}, kind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "cut")
	pid, err := a.driver.Spawn(ctx, "ledger", key.ID)
	require.NoError(t, err)
	root := a.node.System().Root
	// Messages queued behind a held turn become saved work; those sent while
	// sealed form the boundary batch. Nothing is sent after the cutover, so
	// every message is in the payload or the batch, both protected.
	const total = 3000
	for i := uint64(1); i <= total/2; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	moved := make(chan error, 1)
	go func() {
		_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
		moved <- err
	}()
	for i := uint64(total/2 + 1); i <= total; i++ {
		root.Send(pid, wrapperspb.Int64(int64(i)))
	}
	require.NoError(t, <-moved)
	// Cut the source's connection to the target, as a network failure would.
	a.node.System().EventStream.Publish(&remote.EndpointTerminatedEvent{Address: b.node.Address()})

	deadline := time.Now().Add(testwait.Patience(t))
	for !logs.has("late_cutover") {
		require.True(t, time.Now().Before(deadline), "the resent cutover never arrived")
		time.Sleep(10 * time.Millisecond)
	}
	direct, err := b.driver.Resolve(ctx, key)
	require.NoError(t, err)
	res, err := b.node.System().Root.RequestFuture(direct, wrapperspb.String("stats"), 10*time.Second).Result()
	require.NoError(t, err)
	var l ledger
	require.NoError(t, json.Unmarshal(res.(*wrapperspb.BytesValue).Value, &l))
	require.Zero(t, l.DupSends, "a resent record was taken twice")
	require.EqualValues(t, total, l.Count[0])
}
