// Package stopguard keeps roam's actors alive against a stop roam did not
// decide. roam owns the lifecycle of its incarnations and of its own
// service actors: an actor.Stop (a system message, also from a remote peer)
// or an actor.PoisonPill (a user message) that reached one of them from
// outside would leave the Location Store naming a live owner that no longer
// serves, with nothing to repair it. A guarded mailbox refuses both unless
// its owner allows them at that moment, and reports each refusal.
//
// It also holds what reaches the actor while it is being spawned.
// Proto.Actor registers a spawning actor's name before its mailbox has a
// dispatcher, and its default mailbox schedules a message posted in
// between on that nil dispatcher: the process panics. roam's service actors
// are spawned anew at every node lifecycle, on a remote that peers may be
// sending to the whole time.
package stopguard

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Producer wraps inner: the mailboxes it makes pass actor.Stop and
// actor.PoisonPill on only while allowed() is true; otherwise refused(msg)
// is called and the message is dropped. Everything else passes unchanged,
// and what is posted before the spawn starts the mailbox is passed on, in
// order, when it does.
func Producer(inner actor.MailboxProducer, allowed func() bool, refused func(msg any)) actor.MailboxProducer {
	return func() actor.Mailbox {
		return &guarded{Mailbox: inner(), allowed: allowed, refused: refused}
	}
}

type guarded struct {
	actor.Mailbox
	allowed func() bool
	refused func(msg any)

	// started: Start has run, and the inner mailbox takes posts directly.
	// Until then they wait in early, under mu.
	started atomic.Bool
	mu      sync.Mutex
	early   []post
}

// post is one message posted before Start.
type post struct {
	system bool
	msg    any
}

func (g *guarded) PostSystemMessage(msg any) {
	if _, stop := msg.(*actor.Stop); stop && !g.allowed() {
		g.refused(msg)
		return
	}
	if !g.started.Load() && g.hold(post{system: true, msg: msg}) {
		return
	}
	g.Mailbox.PostSystemMessage(msg)
}

func (g *guarded) PostUserMessage(msg any) {
	if _, pill := actor.UnwrapEnvelopeMessage(msg).(*actor.PoisonPill); pill && !g.allowed() {
		g.refused(msg)
		return
	}
	if !g.started.Load() && g.hold(post{msg: msg}) {
		return
	}
	g.Mailbox.PostUserMessage(msg)
}

// hold keeps p for Start and reports whether it did (false: the mailbox
// started meanwhile, and p goes straight on).
func (g *guarded) hold(p post) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started.Load() {
		return false
	}
	g.early = append(g.early, p)
	return true
}

// Start starts the inner mailbox (its handlers registered by now) and
// passes on what was posted before: the system messages first (Started
// among them), as the mailbox itself would run them, then the user
// messages, each in the order posted. Later posts go straight on.
func (g *guarded) Start() {
	g.Mailbox.Start()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, system := range []bool{true, false} {
		for _, p := range g.early {
			switch {
			case p.system != system:
			case system:
				g.Mailbox.PostSystemMessage(p.msg)
			default:
				g.Mailbox.PostUserMessage(p.msg)
			}
		}
	}
	g.early = nil
	g.started.Store(true)
}
