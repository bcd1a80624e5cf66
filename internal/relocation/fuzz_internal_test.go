package relocation

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/messages"
)

// Every control message a target takes, decoded from any bytes a peer
// sends and handled as the driver handles it (identity, manifest, chunk,
// relayed record and its envelope, cutover, abort), never panics the node
// and never makes the target allocate past its payload limit.
func FuzzTargetControl(f *testing.F) {
	id := &messages.RelocationIdentity{RelocationId: 1, TargetAttemptGeneration: 1,
		CoordinatorFence: &messages.CoordinatorFence{NodeRid: "n", NodeGeneration: 1, OwnerGeneration: 1}}
	seed := func(kind uint8, m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(kind, b)
	}
	seed(0, &messages.RelocationPrepare{Identity: id, Manifest: &messages.PayloadManifest{PayloadTotalLength: 4, PayloadChunkCount: 1}})
	seed(1, &messages.RelocationState{Identity: id, Index: 0, Offset: 0, Data: []byte("abcd")})
	env, _ := toWire("x", wrapperspb.String("hi"))
	seed(2, &messages.RelayedRecord{Identity: id, Envelope: env})
	seed(3, &messages.Cutover{Identity: id, RelayRecordCount: 1})
	seed(4, &messages.RelocationAbort{Identity: id})
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		const maxPayload = 1 << 20
		m, chunks, err := envelope.Split([]byte("abcdefgh"), 4)
		if err != nil {
			t.Fatal(err)
		}
		tg, _ := handoff.NewTarget(handoff.IdentityFromProto(id), handoff.DefaultConfig(),
			handoff.PrepareReceived{Manifest: m, RestoreDeadline: time.Now().Add(time.Minute), MaxPayloadLength: maxPayload})
		tg.Step(handoff.SourceVerified{})
		tg.Step(handoff.ChunkReceived{Chunk: chunks[0]})
		switch kind % 5 {
		case 0:
			var p messages.RelocationPrepare
			if proto.Unmarshal(b, &p) != nil {
				return
			}
			handoff.IdentityFromProto(p.GetIdentity()).Valid()
			ev := handoff.PrepareReceived{Manifest: envelope.Manifest{TotalLength: p.GetManifest().GetPayloadTotalLength(),
				ChunkCount: p.GetManifest().GetPayloadChunkCount(), ChecksumCRC32C: p.GetManifest().GetPayloadChecksumCrc32C()},
				RestoreDeadline: time.UnixMilli(p.GetRestoreDeadlineUnixMillis()), MaxPayloadLength: maxPayload}
			fresh, _ := handoff.NewTarget(handoff.IdentityFromProto(p.GetIdentity()), handoff.DefaultConfig(), ev)
			fresh.Step(handoff.SourceVerified{})
			tg.Step(ev)
		case 1:
			var c messages.RelocationState
			if proto.Unmarshal(b, &c) != nil {
				return
			}
			tg.Step(handoff.ChunkReceived{Chunk: envelope.Chunk{Index: c.GetIndex(), Offset: c.GetOffset(), Data: c.GetData()}})
		case 2:
			var r messages.RelayedRecord
			if proto.Unmarshal(b, &r) != nil {
				return
			}
			item, err := fromWire(r.GetEnvelope())
			if err != nil {
				return
			}
			rec, _ := deterministic.Marshal(r.GetEnvelope())
			tg.Step(handoff.RelayRecordReceived{Epoch: r.GetResendEpoch(), Index: int(r.GetIndex()), Record: rec, Item: item})
		case 3:
			var c messages.Cutover
			if proto.Unmarshal(b, &c) != nil {
				return
			}
			tg.Step(handoff.CutoverReceivedEvent{Epoch: c.GetResendEpoch(), Sum: handoff.RelaySum{Count: c.GetRelayRecordCount(), CRC: c.GetRelayCrc32C()}})
		case 4:
			var a messages.RelocationAbort
			if proto.Unmarshal(b, &a) != nil {
				return
			}
			tg.Step(handoff.AbortReceived{Reason: a.GetReason()})
		}
	})
}
