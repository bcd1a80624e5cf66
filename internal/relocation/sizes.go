package relocation

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/roamerr"
)

// A relocatable object may be served by any node, so what it is asked and
// what it answers keep the size limit of a message between nodes
// (meshnode.MaxMessageBytes) on its own node too: a call must not work
// or fail depending on where the object happens to be. Across nodes the
// sending node refuses it before it is sent (meshnode).

// Refuse (mailbox.Hooks) answers a request from this node over the size
// limit with CapacityExceeded as it is posted, instead of running it. A
// request from another node was refused there (and is within the frame
// limit anyway): it is not measured again.
func (o *object) Refuse(msg any) bool {
	env, ok := msg.(*actor.MessageEnvelope)
	if !ok || env.Sender == nil || env.Sender.Address != o.d.sys.Address() {
		return false
	}
	n := failure.Size(env.Message)
	if n <= meshnode.MaxMessageBytes {
		return false
	}
	respondFailure(o.d.sys, env.Sender, env.Message, roamerr.CodeCapacityExceeded, o.key.ID,
		fmt.Sprintf("the message is %d bytes, more than the %d a node accepts; not run", n, meshnode.MaxMessageBytes))
	return true
}

// limitReply is what the incarnation's actor sends to pid in place of
// message (hostContext.send): a reply over the size limit is not sent;
// its caller gets CapacityExceeded in its place (failure.Answer: a grain
// caller a grain error response), and it is logged and counted
// (roam.relocation.replies_too_large), never dropped without a word. A
// reply is what goes to the sender of the message being handled, or to a
// future (a reply kept for later); a request of the object's own (an
// envelope with a sender) is not one.
func (o *object) limitReply(c *hostContext, pid *actor.PID, message any) any {
	if env, ok := message.(*actor.MessageEnvelope); ok && env.Sender != nil {
		return message
	}
	sender := c.Sender()
	toSender := sender != nil && (sender == pid || sender.Equal(pid))
	if !toSender && !isFuture(pid) {
		return message
	}
	n := failure.Size(actor.UnwrapEnvelopeMessage(message))
	if n <= meshnode.MaxMessageBytes {
		return message
	}
	var request any
	if toSender {
		request = c.Message()
	}
	d := o.d
	d.metrics.replyTooLarge()
	d.replyTooLargeLog.Warn(&d.log).Str("event", "reply_too_large").Str("object_id", o.key.ID).Str("message_type", typeName(actor.UnwrapEnvelopeMessage(message))).
		Int("bytes", n).Int("limit", meshnode.MaxMessageBytes).Msg("a reply over the size limit was not sent; its caller is answered CapacityExceeded")
	return failure.Answer(request, roamerr.CodeCapacityExceeded, o.key.ID,
		fmt.Sprintf("the reply is %d bytes, more than the %d a node accepts; not sent", n, meshnode.MaxMessageBytes))
}
