package relocation

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/roamerr"
)

// toRecord freezes a queued message as a saved-work record: kind (send or
// request), sender, headers, reply route and body (docs/PROTOCOL.md §5.5).
func toRecord(posted any) (envelope.Record, error) {
	header, msg, sender := actor.UnwrapEnvelope(posted)
	pm, ok := msg.(proto.Message)
	if !ok {
		return envelope.Record{}, fmt.Errorf("%w: queued %T is not a protobuf message and cannot move", roamerr.ErrTypeMismatch, msg)
	}
	body, err := deterministic.Marshal(pm)
	if err != nil {
		return envelope.Record{}, fmt.Errorf("%w: marshal %T: %w", roamerr.ErrTypeMismatch, msg, err)
	}
	rec := envelope.Record{
		Kind:        envelope.RecordSend,
		MessageType: string(pm.ProtoReflect().Descriptor().FullName()),
		Body:        body,
	}
	if sender != nil {
		rec.Kind = envelope.RecordRequest
		rec.Source = &envelope.PID{Address: sender.Address, ID: sender.Id}
		rec.ReplyRoute = rec.Source
	}
	if header != nil && header.Length() > 0 {
		for k, v := range header.ToMap() {
			// The operation identity and a request's deadline have their own
			// fields in the record (PROTOCOL.md §5.5).
			switch k {
			case HeaderOperation:
				rec.OperationID = v
				continue
			case HeaderDeadline:
				if ms, err := strconv.ParseUint(v, 10, 64); err == nil {
					rec.DeadlineUnixMillis = ms
					continue
				}
			}
			rec.Metadata = append(rec.Metadata, envelope.Header{Key: k, Value: v})
		}
		sort.Slice(rec.Metadata, func(i, j int) bool { return rec.Metadata[i].Key < rec.Metadata[j].Key })
	}
	if sender != nil && rec.OperationID == "" && rec.DeadlineUnixMillis == 0 {
		// A request by Spot ID names both in its reply route (ReplyRouteID).
		if op, ms, ok := requestOf(nil, sender); ok && ms > 0 {
			rec.OperationID, rec.DeadlineUnixMillis = op, uint64(ms)
		}
	}
	return rec, nil
}

// fromRecord thaws a saved-work record into what the mailbox dispatches.
func fromRecord(rec envelope.Record) (any, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(rec.MessageType))
	if err != nil {
		return nil, fmt.Errorf("%w: unknown message type %q", roamerr.ErrTypeMismatch, rec.MessageType)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(rec.Body, msg); err != nil {
		return nil, fmt.Errorf("%w: unmarshal %s: %w", roamerr.ErrTypeMismatch, rec.MessageType, err)
	}
	if rec.ReplyRoute == nil && len(rec.Metadata) == 0 && rec.OperationID == "" && rec.DeadlineUnixMillis == 0 {
		return msg, nil
	}
	env := &actor.MessageEnvelope{Message: msg}
	if r := rec.ReplyRoute; r != nil {
		env.Sender = actor.NewPID(r.Address, r.ID)
	}
	for _, h := range rec.Metadata {
		env.SetHeader(h.Key, h.Value)
	}
	if rec.OperationID != "" {
		env.SetHeader(HeaderOperation, rec.OperationID)
	}
	if rec.DeadlineUnixMillis != 0 {
		env.SetHeader(HeaderDeadline, strconv.FormatUint(rec.DeadlineUnixMillis, 10))
	}
	return env, nil
}
