package envelope_test

import (
	"encoding/binary"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// minimalFixture is the smallest shape of an envelope: no states, no saved
// work, no timers. Its bytes are testdata/minimal.bin.
func minimalFixture() *envelope.Envelope {
	return &envelope.Envelope{
		Relocation: envelope.Relocation{
			RelocationID:            7,
			TargetAttemptGeneration: 1,
			CoordinatorFence:        envelope.Fence{NodeRid: "node-a", NodeGeneration: 3, OwnerGeneration: 2},
		},
		Object:             envelope.Object{Kind: 1, ID: "cart-42", ObjectGeneration: 5, StableType: "shop.Cart"},
		ApplicationVersion: "1.0.0",
	}
}

// fullFixture uses every field: two participants' states, a send and a
// request (source, reply route, deadline, two headers), a timer
// registration and a pending tick, and non-ASCII UTF-8. Its bytes are
// testdata/full.bin.
func fullFixture() *envelope.Envelope {
	return &envelope.Envelope{
		Relocation: envelope.Relocation{
			RelocationID:            0x0102030405060708,
			TargetAttemptGeneration: 3,
			CoordinatorFence:        envelope.Fence{NodeRid: "node-b", NodeGeneration: 12, OwnerGeneration: 4},
		},
		Object:             envelope.Object{Kind: 2, ID: "warenkorb-ü-42", ObjectGeneration: 9, StableType: "shop.v1.Cart"},
		ApplicationVersion: "2.4.1",
		ApplicationStates: []envelope.ApplicationState{
			{ParticipantID: 1, State: []byte{0xca, 0xfe, 0x00, 0x01}},
			{ParticipantID: 2, State: []byte("counter=3")},
		},
		SavedWork: []envelope.SavedWork{
			{ParticipantID: 1, Order: 1, Record: envelope.Record{
				Kind:        envelope.RecordSend,
				MessageType: "shop.v1.AddItem",
				Body:        []byte{0x0a, 0x03, 'h', 'a', 't'},
			}},
			{ParticipantID: 2, Order: 5, Record: envelope.Record{
				Kind:   envelope.RecordRequest,
				Source: &envelope.PID{Address: "10.0.0.5:8090", ID: "client$7"},
				Metadata: []envelope.Header{
					{Key: "tenant", Value: "acme"},
					{Key: "trace-id", Value: "4bf92f35"},
				},
				OperationID:        "op-17",
				OperationKind:      1,
				ReplyRoute:         &envelope.PID{Address: "10.0.0.5:8090", ID: "future$12"},
				DeadlineUnixMillis: 1767225630000,
				MessageType:        "shop.v1.Checkout",
				Body:               []byte{0x08, 0x2a},
			}},
		},
		TimerRegistrations: []envelope.TimerRegistration{{
			ParticipantID:            1,
			Name:                     "flush",
			HandlerType:              "shop.v1.FlushTick",
			PeriodMillis:             30000,
			OverrunPolicy:            1,
			CatchUpLimit:             3,
			UnhandledExceptionPolicy: 2,
			CompletedDeliveryIndex:   10,
			CompletedScheduleIndex:   11,
			NextScheduleUnixMillis:   1767225600000,
		}},
		PendingTimerTicks: []envelope.PendingTimerTick{{
			ParticipantID:       1,
			Order:               4,
			Name:                "flush",
			DeliveryIndex:       11,
			ScheduledIndex:      12,
			ScheduledUnixMillis: 1767225570000,
			SkippedTicks:        1,
		}},
	}
}

// wire builds streams by hand, independently of the encoder, so tests can
// write streams Encode would refuse and check the encoder against the
// format description. Lengths are written as given: text8 of a 300-byte
// string writes the (wrong) length byte 44.
type wire []byte

func (w wire) u8(v uint8) wire   { return append(w, v) }
func (w wire) u16(v uint16) wire { return binary.BigEndian.AppendUint16(w, v) }
func (w wire) u32(v uint32) wire { return binary.BigEndian.AppendUint32(w, v) }
func (w wire) u64(v uint64) wire { return binary.BigEndian.AppendUint64(w, v) }
func (w wire) text8(s string) wire {
	return append(w.u8(uint8(len(s))), s...)
}
func (w wire) text16(s string) wire {
	return append(w.u16(uint16(len(s))), s...)
}
func (w wire) bytes32(b []byte) wire {
	return append(w.u32(uint32(len(b))), b...)
}

func cat(parts ...wire) wire {
	var out wire
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// vec is a vector: the u32 count of elems, then the elements.
func vec(elems ...wire) wire {
	return cat(append([]wire{wire{}.u32(uint32(len(elems)))}, elems...)...)
}

// head is relocation, object and applicationVersion.
type head struct {
	nodeRid, id, stableType, version string
}

func okHead() head { return head{nodeRid: "n", id: "a", stableType: "T", version: "v"} }

func (h head) wire() wire {
	return wire{}.
		u64(7).u64(1).text8(h.nodeRid).u64(3).u64(2).
		u8(1).text8(h.id).u64(5).text8(h.stableType).
		text8(h.version)
}

// stream is a whole envelope from a head and four vectors.
func stream(h head, states, work, timers, ticks []wire) wire {
	return cat(h.wire(), vec(states...), vec(work...), vec(timers...), vec(ticks...))
}

func state(p uint32, data string) wire { return wire{}.u32(p).bytes32([]byte(data)) }

type rawPID struct{ address, id string }

// rawRecord is a Record with raw presence bytes; a PID is written only
// when its presence byte is 1.
type rawRecord struct {
	kind                      uint8
	sourcePresence            uint8
	source                    rawPID
	headers                   [][2]string
	operationID               string
	operationKind             uint8
	replyPresence             uint8
	reply                     rawPID
	deadline                  uint64
	messageType               string
	body                      []byte
	overrideHeaderCount       bool
	headerCount               uint32
	overrideBodyLength        bool
	bodyLength                uint32
	overrideMessageTypeLength bool
	messageTypeLength         uint16
}

func okRecord() rawRecord { return rawRecord{kind: 1, messageType: "m.T"} }

func (r rawRecord) wire() wire {
	w := wire{}.u8(r.kind).u8(r.sourcePresence)
	if r.sourcePresence == 1 {
		w = w.text16(r.source.address).text16(r.source.id)
	}
	n := uint32(len(r.headers))
	if r.overrideHeaderCount {
		n = r.headerCount
	}
	w = w.u32(n)
	for _, h := range r.headers {
		w = w.text16(h[0]).text16(h[1])
	}
	w = w.text8(r.operationID).u8(r.operationKind).u8(r.replyPresence)
	if r.replyPresence == 1 {
		w = w.text16(r.reply.address).text16(r.reply.id)
	}
	w = w.u64(r.deadline)
	if r.overrideMessageTypeLength {
		w = append(w.u16(r.messageTypeLength), r.messageType...)
	} else {
		w = w.text16(r.messageType)
	}
	if r.overrideBodyLength {
		return append(w.u32(r.bodyLength), r.body...)
	}
	return w.bytes32(r.body)
}

func work(p uint32, order uint64, r rawRecord) wire { return cat(wire{}.u32(p).u64(order), r.wire()) }

func timer(p uint32, name, handler string) wire {
	return wire{}.u32(p).text8(name).text16(handler).u64(1000).u8(0).u32(0).u8(0).u64(0).u64(0).u64(0)
}

func tick(p uint32, order uint64, name string) wire {
	return wire{}.u32(p).u64(order).text8(name).u64(1).u64(1).u64(0).u32(0)
}

// fullWire is fullFixture written by hand from the format description.
func fullWire() wire {
	return cat(
		wire{}.u64(0x0102030405060708).u64(3).text8("node-b").u64(12).u64(4),
		wire{}.u8(2).text8("warenkorb-ü-42").u64(9).text8("shop.v1.Cart"),
		wire{}.text8("2.4.1"),
		vec(wire{}.u32(1).bytes32([]byte{0xca, 0xfe, 0x00, 0x01}), wire{}.u32(2).bytes32([]byte("counter=3"))),
		vec(
			work(1, 1, rawRecord{kind: 1, messageType: "shop.v1.AddItem", body: []byte{0x0a, 0x03, 'h', 'a', 't'}}),
			work(2, 5, rawRecord{
				kind: 2, sourcePresence: 1, source: rawPID{"10.0.0.5:8090", "client$7"},
				headers:     [][2]string{{"tenant", "acme"}, {"trace-id", "4bf92f35"}},
				operationID: "op-17", operationKind: 1,
				replyPresence: 1, reply: rawPID{"10.0.0.5:8090", "future$12"},
				deadline: 1767225630000, messageType: "shop.v1.Checkout", body: []byte{0x08, 0x2a},
			}),
		),
		vec(wire{}.u32(1).text8("flush").text16("shop.v1.FlushTick").u64(30000).u8(1).u32(3).u8(2).u64(10).u64(11).u64(1767225600000)),
		vec(wire{}.u32(1).u64(4).text8("flush").u64(11).u64(12).u64(1767225570000).u32(1)),
	)
}
