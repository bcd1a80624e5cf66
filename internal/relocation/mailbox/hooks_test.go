package mailbox

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
)

// guardHooks is an incarnation's hooks as far as stops go: a stop passes
// only while allowed; every refusal is recorded.
type guardHooks struct {
	allowed atomic.Bool
	mu      sync.Mutex
	refused []any
	// refuse, if set, is Refuse (set before the actor is spawned).
	refuse func(msg any) bool
}

func (g *guardHooks) GateOpen() bool      { return true }
func (g *guardHooks) Intercept(any) bool  { return false }
func (g *guardHooks) Closed(any)          {}
func (g *guardHooks) StopAllowed() bool   { return g.allowed.Load() }
func (g *guardHooks) Refuse(msg any) bool { return g.refuse != nil && g.refuse(msg) }
func (g *guardHooks) StopRefused(msg any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refused = append(g.refused, msg)
}

func (g *guardHooks) refusals() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.refused)
}

// pills counts the refused PoisonPills (enveloped or not).
func (g *guardHooks) pills() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, m := range g.refused {
		if _, ok := actor.UnwrapEnvelopeMessage(m).(*actor.PoisonPill); ok {
			n++
		}
	}
	return n
}

// A stop the hooks do not allow never reaches the actor, in whatever form
// it comes — a Stop system message, a PoisonPill, one in an envelope or
// inside a MessageBatch — and each is reported; once allowed, a stop stops.
func TestHooksRefuseStopsTheyDoNotAllow(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	g := &guardHooks{}
	pid, _ := spawn(t, system, recordingActor(rec), WithHooks(g))

	system.Root.Stop(pid)
	system.Root.Poison(pid)
	system.Root.Send(pid, &actor.MessageEnvelope{Message: &actor.PoisonPill{}})
	system.Root.Send(pid, &testBatch{msgs: []any{1, &actor.PoisonPill{}, 2}})
	system.Root.Send(pid, 3)
	got := rec.waitFor(t, "the numbers after the refused stops", countOf(3, isInt))
	require.Equal(t, []int{1, 2, 3}, ints(only(got, isInt)))
	require.Equal(t, 4, g.refusals(), "Stop, PoisonPill, an enveloped PoisonPill and one in a batch")
	require.Equal(t, 3, g.pills(), "a PoisonPill is refused when posted, before the actor turns it into a stop of its own")
	stopped := func(v any) bool { _, ok := v.(*actor.Stopping); return ok }
	require.Empty(t, only(got, stopped), "no refused stop reached the actor")

	g.allowed.Store(true)
	system.Root.Stop(pid)
	rec.waitFor(t, "the allowed stop", countOf(1, stopped))
	require.Equal(t, 4, g.refusals())
}

// A message the hooks refuse as it is posted is neither dispatched nor
// held — while open, or sealed and then unsealed — in whatever form it
// comes; the others keep their order.
func TestHooksRefuseMessagesAsTheyArePosted(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	var refusedN atomic.Int64
	g := &guardHooks{refuse: func(msg any) bool {
		if n, ok := actor.UnwrapEnvelopeMessage(msg).(int); ok && n < 0 {
			refusedN.Add(1)
			return true
		}
		return false
	}}
	pid, mb := spawn(t, system, recordingActor(rec), WithHooks(g))

	system.Root.Send(pid, 1)
	system.Root.Send(pid, -1)
	system.Root.Send(pid, &actor.MessageEnvelope{Message: -2})
	system.Root.Send(pid, &testBatch{msgs: []any{2, -3, 3}})
	rec.waitFor(t, "the messages not refused", countOf(3, isInt))
	saved := sealSync(t, mb)
	system.Root.Send(pid, -4)
	system.Root.Send(pid, 4)
	require.NoError(t, mb.Unseal(saved))
	got := rec.waitFor(t, "the message posted while sealed", countOf(4, isInt))
	require.Equal(t, []int{1, 2, 3, 4}, ints(only(got, isInt)))
	require.EqualValues(t, 4, refusedN.Load())
}
