package relocation_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// linkBlobKind holds a 1 MiB state: five chunks at the default chunk limit.
func linkBlobKind() relocation.Kind {
	return relocation.Kind{StableType: "blob", Producer: func() actor.Actor { return &blob{} }, Policy: relocation.PreserveStateWith(blobState{size: 1 << 20})}
}

// moveBlob moves key from one node to the other and checks that the whole
// state arrived (the target checks the stream's length and CRC before it
// restores anything; the blob answers its state's length).
func moveBlob(t *testing.T, pid *actor.PID, from, to *testNode, key location.AuthorityKey) {
	t.Helper()
	out, err := from.driver.Relocate(context.Background(), key, to.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Greater(t, out.Chunks, uint32(4), "1 MiB of state in 256 KiB chunks")
	res, err := from.node.System().Root.RequestFuture(pid, wrapperspb.String("len"), 10*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), res.(*wrapperspb.Int64Value).GetValue())
}

// A move's chunks take the target's chunk link, not the Proto.Actor
// connection, and are read into the buffer the target assembles in.
func TestChunksTakeTheChunkLink(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, linkBlobKind())
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, linkBlobKind())
	key := location.Key(location.KindActor, "linked")
	pid, err := a.driver.Spawn(context.Background(), "blob", key.ID)
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		moveBlob(t, pid, a, b, key)
		moveBlob(t, pid, b, a, key)
	}
	for _, n := range []*testNode{a, b} {
		linked, inPlace := relocation.LinkedChunks(n.driver)
		require.GreaterOrEqual(t, linked, int64(3*5), "every chunk of three moves in came on the link")
		require.Positive(t, inPlace, "chunks of an accepted move are read in place")
	}
}

// A target whose link fails still gets the move: the source resends on the
// Proto.Actor connection what was not credited, and sends that peer's
// chunks there for a while.
func TestALostChunkLinkFallsBackToTheProtoActorConnection(t *testing.T) {
	store := newStore(t)
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, linkBlobKind())
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, linkBlobKind())
	key := location.Key(location.KindActor, "unlinked")
	pid, err := a.driver.Spawn(context.Background(), "blob", key.ID)
	require.NoError(t, err)
	moveBlob(t, pid, a, b, key)
	moveBlob(t, pid, b, a, key)
	linked, _ := relocation.LinkedChunks(b.driver)
	require.Positive(t, linked)

	relocation.CloseChunkLink(b.driver)
	moveBlob(t, pid, a, b, key)
	require.True(t, relocation.ChunkLinkDown(a.driver, b.node.Address()), "the source saw the link fail")
	after, _ := relocation.LinkedChunks(b.driver)
	require.Equal(t, linked, after, "no chunk came on the closed link")
	// Without its link b sends on the Proto.Actor connection too.
	moveBlob(t, pid, b, a, key)
}

// With the link off (ChunkLinkPort -1) a node's chunks ride the Proto.Actor
// connection both ways: it announces no link and sends on none.
func TestChunkLinkOff(t *testing.T) {
	store := newStore(t)
	off := relocation.Config{ChunkLinkPort: -1}
	a := startNodeConfig(t, store, off, linkBlobKind())
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, linkBlobKind())
	key := location.Key(location.KindActor, "off")
	pid, err := a.driver.Spawn(context.Background(), "blob", key.ID)
	require.NoError(t, err)
	moveBlob(t, pid, a, b, key) // to a node with a link, from one without
	moveBlob(t, pid, b, a, key) // to a node without one
	moveBlob(t, pid, a, b, key)
	linkedA, _ := relocation.LinkedChunks(a.driver)
	require.Zero(t, linkedA, "a node without a link reads none")
	linkedB, _ := relocation.LinkedChunks(b.driver)
	require.Zero(t, linkedB, "a node without a link sends on none")
}

// A node lifecycle on a fixed link port that something still holds (the
// lifecycle before it, whose link closes once its stop is seen) waits for
// the port instead of failing to start.
func TestAFixedChunkLinkPortIsWaitedFor(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := held.Addr().(*net.TCPAddr).Port
	store := newStore(t)
	var logs logBuffer
	log := zerolog.New(&logs)
	node, err := meshnode.Start(context.Background(), meshnode.Config{Store: store, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	started := make(chan error, 1)
	go func() {
		_, err := relocation.New(node, store, relocation.Config{ChunkLinkPort: port, Logger: &log})
		started <- err
	}()
	testwait.For(t, func() bool { return logs.has("chunk_link_port_in_use") }, "the port found in use")
	require.NoError(t, held.Close())
	require.NoError(t, <-started, "the link took the port once it was free")
}
