package relocation_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// replies collects what a target sends back to a hand-made source.
type replies struct{ got chan proto.Message }

func (r *replies) Receive(c actor.Context) {
	if m, ok := c.Message().(proto.Message); ok {
		r.got <- m
	}
}

// A chunk or Restore request whose identity differs in any part (another
// attempt, another fence) is not attached to the assembly in progress, and
// neither is one from another node: the target assembles only the exact
// identity's chunks and replies relay-ready for it.
// Reference: docs/PROTOCOL.md §2.3, §5.7, §11, §12.1 item 8 (attribution by
// identity and connection).
func TestChunksAreAttributedByExactIdentityOnly(t *testing.T) {
	store := newStore(t)
	target := startNodeWith(t, store, counterKind)
	source, err := meshnode.Start(context.Background(), meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = source.Stop(context.Background()) })
	r := &replies{got: make(chan proto.Message, 16)}
	self, err := source.System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return r }), relocation.DriverName)
	require.NoError(t, err)
	stranger, err := meshnode.Start(context.Background(), meshnode.Config{Store: store})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stranger.Stop(context.Background()) })

	// The object exists in the store, owned by the hand-made source.
	key := location.Key(location.KindActor, "attr")
	sd := source.Descriptor()
	_, err = store.CompareAndSet(context.Background(), key, 0, &location.Record{ObjectGeneration: 1, AuthorityOwnerGeneration: 1,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, StableType: "counter",
		Owner: &messages.Owner{Mesh: sd.GetMesh(), NodeRid: sd.GetNodeRid(), NodeGeneration: sd.GetNodeGeneration()}})
	require.NoError(t, err)

	id := &messages.RelocationIdentity{RelocationId: 42, TargetAttemptGeneration: 1,
		CoordinatorFence: &messages.CoordinatorFence{NodeRid: sd.GetNodeRid(), NodeGeneration: sd.GetNodeGeneration(), OwnerGeneration: 1}}
	stream, err := envelope.Encode(&envelope.Envelope{
		Relocation:        envelope.Relocation{RelocationID: 42, TargetAttemptGeneration: 1, CoordinatorFence: envelope.Fence{NodeRid: sd.GetNodeRid(), NodeGeneration: sd.GetNodeGeneration(), OwnerGeneration: 1}},
		Object:            envelope.Object{Kind: uint8(location.KindActor), ID: key.ID, ObjectGeneration: 1, StableType: "counter"},
		ApplicationStates: []envelope.ApplicationState{{ParticipantID: 1, State: make([]byte, 24)}},
	})
	require.NoError(t, err)
	m, chunks, err := envelope.Split(stream, 16)
	require.NoError(t, err)
	to := relocation.PID(target.node.Address())
	send := func(from *actor.PID, sys *actor.ActorSystem, msg proto.Message) {
		sys.Root.RequestWithCustomSender(to, msg, from)
	}
	// A move is admitted by the target's capability answer: its ticket.
	reply := askCapability(t, source.System(), target.node.Address(),
		&messages.NodeRef{NodeRid: sd.GetNodeRid(), NodeGeneration: sd.GetNodeGeneration(), Address: source.Address()})
	require.True(t, reply.GetSupported(), reply.GetReason())
	ticket := reply.GetMoveTicket()
	send(self, source.System(), &messages.RelocationPrepare{MoveTicket: ticket, Identity: id, Object: &messages.ObjectRef{Kind: key.Kind, Id: key.ID, ObjectGeneration: 1, StableType: "counter"},
		Manifest:   &messages.PayloadManifest{PayloadTotalLength: m.TotalLength, PayloadChunkCount: m.ChunkCount, PayloadChecksumCrc32C: m.ChecksumCRC32C},
		ChunkLimit: 16, Source: &messages.NodeRef{NodeRid: sd.GetNodeRid(), NodeGeneration: sd.GetNodeGeneration(), Address: source.Address()},
		RestoreDeadlineUnixMillis: time.Now().Add(10 * time.Second).UnixMilli(), NewOwnerGeneration: 2, SealedAtUnixNanos: time.Now().UnixNano()})

	garbage := func(c envelope.Chunk) []byte {
		b := make([]byte, len(c.Data))
		for i := range b {
			b[i] = 0xEE
		}
		return b
	}
	otherAttempt := proto.Clone(id).(*messages.RelocationIdentity)
	otherAttempt.TargetAttemptGeneration = 2
	otherFence := proto.Clone(id).(*messages.RelocationIdentity)
	otherFence.CoordinatorFence.OwnerGeneration = 9
	strangerPID := actor.NewPID(stranger.Address(), relocation.DriverName)
	for _, c := range chunks {
		// Wrong identities, and the right identity from the wrong node, first.
		send(self, source.System(), &messages.RelocationState{Identity: otherAttempt, Index: c.Index, Offset: c.Offset, Data: garbage(c)})
		send(self, source.System(), &messages.RelocationState{Identity: otherFence, Index: c.Index, Offset: c.Offset, Data: garbage(c)})
		send(strangerPID, stranger.System(), &messages.RelocationState{Identity: id, Index: c.Index, Offset: c.Offset, Data: garbage(c)})
	}
	for _, c := range chunks {
		send(self, source.System(), &messages.RelocationState{Identity: id, Index: c.Index, Offset: c.Offset, Data: c.Data})
	}
	deadline := time.After(testwait.Patience(t))
	for {
		select {
		case msg := <-r.got:
			switch msg := msg.(type) {
			case *messages.RelayReady:
				require.True(t, proto.Equal(id, msg.GetIdentity()))
				return
			case *messages.RelocationFailed:
				t.Fatalf("the target failed the move: %v %s", msg.GetReason(), msg.GetDetail())
			}
		case <-deadline:
			t.Fatal("no relay-ready")
		}
	}
}
