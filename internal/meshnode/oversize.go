package meshnode

import (
	"fmt"
	"strings"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/roamerr"
)

// checkRequestSizes puts a size check in front of every request sys
// sends to another process: one over MaxMessageBytes is answered
// CapacityExceeded at once. Without it the remote marshals the message,
// and splitFrames sizes and copies it again before dropping it — seconds
// for a message of 64 MiB on a busy machine, while the caller waits — and
// a grain caller got an answer its generated client does not know
// (failure.Answer). It must run before the remote starts: Proto.Actor
// asks the address resolvers in the order they were registered, and the
// remote's own takes every address.
func checkRequestSizes(sys *actor.ActorSystem, log zerolog.Logger) {
	if _, done := sizeChecked.LoadOrStore(sys, true); done {
		return
	}
	reg := sys.ProcessRegistry
	next := len(reg.RemoteHandlers) + 1 // the resolvers registered after this one
	reg.RegisterAddressResolver(func(pid *actor.PID) (actor.Process, bool) {
		for _, h := range reg.RemoteHandlers[next:] {
			if p, ok := h(pid); ok {
				return &sizeCheckedProcess{Process: p, sys: sys, log: log}, true
			}
		}
		return nil, false
	})
}

// sizeChecked are the actor systems checkRequestSizes set up.
var sizeChecked sync.Map // *actor.ActorSystem → bool

// sizeCheckedProcess is a process of another node as its requests pass
// the size check. One-way sends are left to splitFrames, which drops
// those over the peer's limit loudly: measuring every send would cost
// every send, and a send has nobody to answer.
type sizeCheckedProcess struct {
	actor.Process
	sys *actor.ActorSystem
	log zerolog.Logger
}

func (p *sizeCheckedProcess) SendUserMessage(pid *actor.PID, message any) {
	if env, ok := message.(*actor.MessageEnvelope); ok && env.Sender != nil {
		if n := failure.Size(env.Message); n > MaxMessageBytes {
			refuseTooLarge(p.log, p.sys, pid.Address, pid, env.Sender, env.Message, failure.IsGrainRequest(env.Message), n, MaxMessageBytes)
			return
		}
	}
	p.Process.SendUserMessage(pid, message)
}

// refuseTooLarge reports a message to target, over limit, that is not
// sent (message_too_large), and answers CapacityExceeded for it: to
// target when it is a reply to a request of the peer's (its caller is
// told, not left to time out), else to its sender on this node (as a
// grain caller reads it when grain says it is a grain request).
func refuseTooLarge(log zerolog.Logger, sys *actor.ActorSystem, peer string, target, sender *actor.PID, msg any, grain bool, size, limit int) {
	log.Error().Str("event", "message_too_large").Str("peer", peer).Str("target", target.GetId()).
		Str("message_type", typeName(msg)).Int("bytes", size).Int("limit", limit).
		Msg("a message larger than a frame may be was not sent; the stream and the other messages go on")
	detail := fmt.Sprintf("the message (%d bytes) is larger than the peer accepts (%d bytes); not sent", size, limit)
	if strings.HasPrefix(target.GetId(), "future") {
		sys.Root.Send(target, failure.Answer(nil, roamerr.CodeCapacityExceeded, target.GetId(), detail))
		return
	}
	if sender == nil || sender.GetAddress() != sys.Address() {
		return
	}
	answer := failure.Answer(nil, roamerr.CodeCapacityExceeded, target.GetId(), detail)
	if grain {
		answer = failure.GrainAnswer(roamerr.CodeCapacityExceeded, target.GetId(), detail)
	}
	sys.Root.Send(sender, answer)
}

// typeName is the message's protobuf name, or the name a frame gives it.
func typeName(msg any) string {
	switch m := msg.(type) {
	case string:
		return m
	case proto.Message:
		return string(proto.MessageName(m))
	}
	return fmt.Sprintf("%T", msg)
}
