package stopguard

import (
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
)

// invoked records what a mailbox hands its actor, in order.
type invoked struct {
	mu   sync.Mutex
	msgs []any
}

func (i *invoked) InvokeSystemMessage(m any) { i.add(m) }
func (i *invoked) InvokeUserMessage(m any)   { i.add(m) }
func (i *invoked) EscalateFailure(any, any)  {}
func (i *invoked) add(m any) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.msgs = append(i.msgs, m)
}

// A message that reaches a guarded mailbox while its actor is being
// spawned (its name registered, no dispatcher yet) waits for the start,
// and is then handed on after Started: Proto.Actor's default mailbox alone
// panics on it.
func TestAMessagePostedDuringTheSpawnWaitsForTheStart(t *testing.T) {
	require.Panics(t, func() { actor.Unbounded()().PostUserMessage("early") }, "the premise: Proto.Actor's default mailbox")

	mb := Producer(actor.Unbounded(), func() bool { return false }, func(any) {})()
	mb.PostUserMessage("early") // between the name's registration and RegisterHandlers
	inv := &invoked{}
	mb.RegisterHandlers(inv, actor.NewSynchronizedDispatcher(300))
	started := &actor.Started{}
	mb.PostSystemMessage(started) // as the spawner does, before Start
	mb.PostUserMessage("second")
	require.Empty(t, inv.msgs, "nothing runs before Start")
	mb.Start()
	mb.PostUserMessage("after")
	require.Equal(t, []any{started, "early", "second", "after"}, inv.msgs)
}

// A stop from outside is still refused while the actor is being spawned.
func TestAStopDuringTheSpawnIsRefused(t *testing.T) {
	var refused []any
	mb := Producer(actor.Unbounded(), func() bool { return false }, func(m any) { refused = append(refused, m) })()
	mb.PostSystemMessage(&actor.Stop{})
	mb.PostUserMessage(&actor.PoisonPill{})
	inv := &invoked{}
	mb.RegisterHandlers(inv, actor.NewSynchronizedDispatcher(300))
	mb.Start()
	require.Len(t, refused, 2)
	require.Empty(t, inv.msgs)
}
