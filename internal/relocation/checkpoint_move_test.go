package relocation_test

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// countedCheckpoints counts the checkpoint reads and writes of every node
// that shares it.
type countedCheckpoints struct {
	location.CheckpointStore
	gets, puts atomic.Int64
}

func (c *countedCheckpoints) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	c.gets.Add(1)
	return c.CheckpointStore.GetCheckpoint(ctx, key)
}

func (c *countedCheckpoints) PutCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, data []byte) (location.StoreVersion, error) {
	c.puts.Add(1)
	return c.CheckpointStore.PutCheckpoint(ctx, key, expected, data)
}

// storedCount is the counter's count in key's stored checkpoint, and the
// checkpoint's version and fence (read from the store itself, not
// counted).
func storedCount(t *testing.T, cps location.CheckpointStore, key location.AuthorityKey) (int64, location.StoreVersion, checkpoint.Fence) {
	t.Helper()
	data, v, err := cps.GetCheckpoint(context.Background(), key)
	require.NoError(t, err)
	c, err := checkpoint.Decode(data)
	require.NoError(t, err)
	require.Len(t, c.State, 24)
	return int64(binary.BigEndian.Uint64(c.State)), v, c.Fence
}

// checkpointedPair starts two nodes of one store whose checkpoint calls
// are counted, hosting the counter kind with its checkpoint policy set by
// policy, and spawns the Actor id on the first.
func checkpointedPair(t *testing.T, id string, policy func(*relocation.Kind)) (*countedCheckpoints, *testNode, *testNode, location.AuthorityKey, *actor.PID) {
	t.Helper()
	store := newStore(t)
	cps := &countedCheckpoints{CheckpointStore: store.(location.CheckpointStore)}
	kind := counterKind
	policy(&kind)
	cfg := relocation.Config{Logger: testLogger(), Checkpoints: cps}
	a, b := startNodeConfig(t, store, cfg, kind), startNodeConfig(t, store, cfg, kind)
	key := location.Key(location.KindActor, id)
	pid, err := a.driver.Spawn(context.Background(), "counter", key.ID)
	require.NoError(t, err)
	return cps, a, b, key, pid
}

// A move of an object whose state is stored already (its last capture
// landed and no message ran since) writes no checkpoint at the target:
// the stored one holds exactly what arrived. The target's next capture
// writes over the version its source knew: one compare-and-set, no read.
// Before, each move cost the target a read and a write of the same state
// (a drain on Consul: 2.7 of its 5.7 store calls per unit).
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestAMoveWritesNoCheckpointOfAStateAlreadyStored(t *testing.T) {
	cps, a, b, key, pid := checkpointedPair(t, "stored", func(k *relocation.Kind) { k.CheckpointEvery = 1 })
	ctx := context.Background()
	for i := int64(1); i <= 3; i++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(i))
	}
	// A turn captures once it has ended, after any reply it sent: wait for
	// the third message's capture in the store instead of asking (a
	// request is a fourth turn, whose capture could land after the flush
	// below, and the move would then start from a version read too early).
	testwait.For(t, func() bool {
		data, _, err := cps.CheckpointStore.GetCheckpoint(ctx, key)
		if err != nil {
			return false
		}
		c, err := checkpoint.Decode(data)
		return err == nil && len(c.State) == 24 && binary.BigEndian.Uint64(c.State) == 3
	}, "the third message's capture written")
	require.NoError(t, a.driver.FlushCheckpoints(ctx))
	n, v0, fence := storedCount(t, cps.CheckpointStore, key)
	require.EqualValues(t, 3, n)
	gets, puts := cps.gets.Load(), cps.puts.Load()

	_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	testwait.For(t, func() bool { ok, err := b.driver.Serving(ctx, key); return err == nil && ok }, "the target serving the moved object")
	require.NoError(t, b.driver.FlushCheckpoints(ctx))
	_, v, _ := storedCount(t, cps.CheckpointStore, key)
	require.Equal(t, v0, v, "the checkpoint the move's state was in stays")
	require.Equal(t, puts, cps.puts.Load(), "no write of a state stored already")
	require.Equal(t, gets, cps.gets.Load(), "no read")

	// The next message runs at the target; its capture compares against
	// v0 as the source knew it.
	require.EqualValues(t, 3, get(t, a.node.System(), pid), "followed to the target")
	// The reply comes before the turn's end captures it: a flush right
	// after it may find nothing to capture yet. Wait for the write.
	testwait.For(t, func() bool { _, v, _ := storedCount(t, cps.CheckpointStore, key); return v != v0 },
		"the target's capture of the turn written")
	require.NoError(t, b.driver.FlushCheckpoints(ctx))
	n, v1, moved := storedCount(t, cps.CheckpointStore, key)
	require.EqualValues(t, 3, n)
	require.NotEqual(t, v0, v1)
	require.Greater(t, moved.OwnerGeneration, fence.OwnerGeneration, "written by the target's incarnation")
	require.Equal(t, puts+1, cps.puts.Load(), "one write")
	require.Equal(t, gets, cps.gets.Load(), "and no read before it")
}

// A move of an object with a turn not captured yet leaves that state to
// the target's policy: the target captures it, and writes it over the
// version its source knew, with no read.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestAMovedStateNotStoredYetIsWrittenByTheTarget(t *testing.T) {
	// Captured by the flushes alone.
	cps, a, b, key, pid := checkpointedPair(t, "unstored", func(k *relocation.Kind) { k.CheckpointInterval = time.Hour })
	ctx := context.Background()
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	a.node.System().Root.Send(pid, wrapperspb.Int64(2))
	require.EqualValues(t, 2, get(t, a.node.System(), pid))
	require.NoError(t, a.driver.FlushCheckpoints(ctx))
	n, v0, _ := storedCount(t, cps.CheckpointStore, key)
	require.EqualValues(t, 2, n)
	a.node.System().Root.Send(pid, wrapperspb.Int64(3))
	require.EqualValues(t, 3, get(t, a.node.System(), pid))
	gets, puts := cps.gets.Load(), cps.puts.Load()

	_, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	testwait.For(t, func() bool { ok, err := b.driver.Serving(ctx, key); return err == nil && ok }, "the target serving the moved object")
	// A turn at the target: the flush then finds the object with turns
	// not captured, whether or not its arrival's own mark ran yet.
	require.EqualValues(t, 3, get(t, a.node.System(), pid), "followed to the target")
	require.NoError(t, b.driver.FlushCheckpoints(ctx))
	n, v1, _ := storedCount(t, cps.CheckpointStore, key)
	require.EqualValues(t, 3, n, "the state that arrived, stored by the target")
	require.NotEqual(t, v0, v1)
	require.Equal(t, puts+1, cps.puts.Load(), "one write")
	require.Equal(t, gets, cps.gets.Load(), "no read before it")
}
