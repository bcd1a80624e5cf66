// Package stopguard keeps roam's actors alive against a stop roam did not
// decide. roam owns the lifecycle of its incarnations and of its own
// service actors: an actor.Stop (a system message, also from a remote peer)
// or an actor.PoisonPill (a user message) that reached one of them from
// outside would leave the Location Store naming a live owner that no longer
// serves, with nothing to repair it. A guarded mailbox refuses both unless
// its owner allows them at that moment, and reports each refusal.
package stopguard

import "github.com/asynkron/protoactor-go/actor"

// Producer wraps inner: the mailboxes it makes pass actor.Stop and
// actor.PoisonPill on only while allowed() is true; otherwise refused(msg)
// is called and the message is dropped. Everything else passes unchanged.
func Producer(inner actor.MailboxProducer, allowed func() bool, refused func(msg any)) actor.MailboxProducer {
	return func() actor.Mailbox {
		return &guarded{Mailbox: inner(), allowed: allowed, refused: refused}
	}
}

type guarded struct {
	actor.Mailbox
	allowed func() bool
	refused func(msg any)
}

func (g *guarded) PostSystemMessage(msg any) {
	if _, stop := msg.(*actor.Stop); stop && !g.allowed() {
		g.refused(msg)
		return
	}
	g.Mailbox.PostSystemMessage(msg)
}

func (g *guarded) PostUserMessage(msg any) {
	if _, pill := actor.UnwrapEnvelopeMessage(msg).(*actor.PoisonPill); pill && !g.allowed() {
		g.refused(msg)
		return
	}
	g.Mailbox.PostUserMessage(msg)
}
