package relocation

import (
	"fmt"
	"strconv"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Envelope headers roam stamps on a message that follows a moved object
// (docs/PROTOCOL.md §4.3, §5.14).
const (
	HeaderHops       = "roam-hops"
	HeaderGeneration = "roam-object-generation"
)

var deterministic = proto.MarshalOptions{Deterministic: true}

// toWire turns a posted user message into its wire envelope. Only protobuf
// messages cross nodes (PROTOCOL.md §4.1): anything else is a TypeMismatch.
func toWire(targetID string, posted any) (*messages.Envelope, error) {
	header, msg, sender := actor.UnwrapEnvelope(posted)
	pm, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%w: %T is not a protobuf message and cannot move between nodes", roamerr.ErrTypeMismatch, msg)
	}
	body, err := deterministic.Marshal(pm)
	if err != nil {
		return nil, fmt.Errorf("%w: marshal %T: %w", roamerr.ErrTypeMismatch, msg, err)
	}
	env := &messages.Envelope{
		TargetId:    targetID,
		MessageType: string(pm.ProtoReflect().Descriptor().FullName()),
		Message:     body,
	}
	if sender != nil {
		env.Sender = &messages.PID{Address: sender.Address, Id: sender.Id}
	}
	if header != nil && header.Length() > 0 {
		env.Headers = header.ToMap()
	}
	return env, nil
}

// fromWire rebuilds the posted value: the message alone, or an
// *actor.MessageEnvelope when it had a sender or headers.
func fromWire(env *messages.Envelope) (any, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(env.GetMessageType()))
	if err != nil {
		return nil, fmt.Errorf("%w: unknown message type %q: %w", roamerr.ErrTypeMismatch, env.GetMessageType(), err)
	}
	msg := mt.New().Interface()
	if err := proto.Unmarshal(env.GetMessage(), msg); err != nil {
		return nil, fmt.Errorf("%w: unmarshal %s: %w", roamerr.ErrTypeMismatch, env.GetMessageType(), err)
	}
	if env.GetSender() == nil && len(env.GetHeaders()) == 0 {
		return msg, nil
	}
	out := &actor.MessageEnvelope{Message: msg}
	if s := env.GetSender(); s != nil {
		out.Sender = actor.NewPID(s.GetAddress(), s.GetId())
	}
	for k, v := range env.GetHeaders() {
		out.SetHeader(k, v)
	}
	return out, nil
}

// withFollowHeaders copies posted with the hop count raised by one and the
// ObjectGeneration stamped, keeping message, sender and other headers
// (PROTOCOL.md §5.14). It returns the new hop count.
func withFollowHeaders(posted any, generation uint64) (*actor.MessageEnvelope, int) {
	header, msg, sender := actor.UnwrapEnvelope(posted)
	out := &actor.MessageEnvelope{Message: msg, Sender: sender}
	hops := 0
	if header != nil {
		for k, v := range header.ToMap() {
			out.SetHeader(k, v)
		}
		hops, _ = strconv.Atoi(header.Get(HeaderHops))
	}
	hops++
	out.SetHeader(HeaderHops, strconv.Itoa(hops))
	out.SetHeader(HeaderGeneration, strconv.FormatUint(generation, 10))
	return out, hops
}
