package meshnode_test

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/meshnode"
	_ "github.com/roamactors/roam/messages" // roam's types, linked as in a node
)

// decodeAsProtoActor walks a batch the way Proto.Actor's endpoint reader
// does (remote/endpoint_reader.go onMessageBatch): unchecked indexes and a
// lookup of the type by name. It panics where the reader would.
func decodeAsProtoActor(b *remote.MessageBatch) {
	if b == nil {
		return
	}
	for _, e := range b.Envelopes {
		if e.Sender != 0 {
			_ = b.Senders[e.Sender-1].Address
		}
		_ = b.Targets[e.Target].Id
		_, _ = remote.Deserialize(e.MessageData, b.TypeNames[e.TypeId], e.SerializerId)
	}
}

func seedFrames(f *testing.F) {
	ok := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{"roam.messages.RouteBarrier", "actor.Terminated"},
		Targets:   []*actor.PID{{Address: "127.0.0.1:1", Id: "roam/relocation"}},
		Senders:   []*actor.PID{{Address: "127.0.0.1:2", Id: "x"}},
		Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 1}, {TypeId: 1, SerializerId: 1, MessageData: []byte("{}")}},
	}}}
	b, _ := proto.Marshal(ok)
	f.Add(b)
	bad := proto.Clone(ok).(*remote.RemoteMessage)
	bad.GetMessageBatch().Envelopes[0].TypeId = 7
	b, _ = proto.Marshal(bad)
	f.Add(b)
	conn, _ := proto.Marshal(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "s", Address: "127.0.0.1:3"}}}}})
	f.Add(conn)
	f.Add([]byte{})
}

// Whatever frame a peer sends, CheckRemoteMessage either refuses it or
// Proto.Actor's reader can decode it without a panic: the remote
// boundary of a node.
func FuzzRemoteFrame(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var rm remote.RemoteMessage
		if proto.Unmarshal(b, &rm) != nil {
			return
		}
		if meshnode.CheckRemoteMessage(&rm) != nil {
			return
		}
		require.NotPanics(t, func() { decodeAsProtoActor(rm.GetMessageBatch()) })
	})
}

// SplitBatch keeps every message (or reports it dropped), in order, each
// part within the limits and as decodable as the whole.
func FuzzSplitBatch(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var rm remote.RemoteMessage
		if proto.Unmarshal(b, &rm) != nil || rm.GetMessageBatch() == nil || meshnode.CheckRemoteMessage(&rm) != nil {
			return
		}
		batch := rm.GetMessageBatch()
		const target, limit = 96, 160
		var dropped []*remote.MessageEnvelope
		parts := meshnode.SplitBatch(batch, target, limit, func(_ *remote.MessageBatch, e *remote.MessageEnvelope, n int) {
			require.Greater(t, n, limit)
			dropped = append(dropped, e)
		})
		type resolved struct {
			typeName, target, sender string
			data                     []byte
		}
		resolve := func(b *remote.MessageBatch, e *remote.MessageEnvelope) resolved {
			r := resolved{typeName: b.TypeNames[e.TypeId], target: b.Targets[e.Target].String(), data: e.MessageData}
			if e.Sender > 0 {
				r.sender = b.Senders[e.Sender-1].String()
			}
			return r
		}
		var want, got []resolved
		for _, e := range batch.Envelopes {
			isDropped := false
			for _, d := range dropped {
				isDropped = isDropped || d == e
			}
			if !isDropped {
				want = append(want, resolve(batch, e))
			}
		}
		for _, p := range parts {
			n := proto.Size(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: p}})
			if len(p.Envelopes) > 1 {
				require.LessOrEqual(t, n, target, "a frame of several messages stays within the target")
			}
			require.LessOrEqual(t, n, limit, "no frame is over the limit")
			require.NoError(t, meshnode.CheckRemoteMessage(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: p}}))
			for _, e := range p.Envelopes {
				got = append(got, resolve(p, e))
			}
		}
		require.Equal(t, len(want), len(got))
		for i := range want {
			require.Equal(t, want[i].typeName, got[i].typeName)
			require.Equal(t, want[i].target, got[i].target)
			require.Equal(t, want[i].sender, got[i].sender)
			require.Equal(t, want[i].data, got[i].data)
		}
	})
}
