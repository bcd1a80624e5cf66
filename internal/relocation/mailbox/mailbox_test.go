package mailbox

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
)

// gateDone is recorded when a gate's turn ends.
type gateDone struct{}

// recordingActor records every message it receives (lifecycle messages
// included); a *gate blocks its turn until released.
func recordingActor(rec *recorder) actor.ReceiveFunc {
	return func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *gate:
			rec.add(msg)
			msg.hold()
			rec.add(gateDone{})
		default:
			rec.add(msg)
		}
	}
}

func isStarted(v any) bool { _, ok := v.(*actor.Started); return ok }

// sealSync seals m and waits for captured, returning the saved work.
func sealSync(t *testing.T, m *Mailbox) []any {
	t.Helper()
	captured := make(chan []any, 1)
	require.NoError(t, m.Seal(func(saved []any) { captured <- saved }))
	return recv(t, captured, "captured")
}

// TestSealWaitsForTurnInProgress: a Seal requested while a handler is
// mid-turn takes effect only when that turn ends; captured then receives the
// unprocessed messages in posting order, and a message posted after the seal
// is held, not dispatched, until Unseal.
// Reference: docs/PROTOCOL.md §5.4
func TestSealWaitsForTurnInProgress(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))

	// g2 and 1..3 are queued behind the blocked g1, so when g2's turn runs
	// they are already in the run loop's batch; 4 and 5 are posted during
	// g2's turn. The seal must take both, in posting order.
	g1, g2 := newGate(), newGate()
	system.Root.Send(pid, g1)
	recv(t, g1.entered, "g1's turn")
	system.Root.Send(pid, g2)
	for i := 1; i <= 3; i++ {
		system.Root.Send(pid, i)
	}
	close(g1.release)
	recv(t, g2.entered, "g2's turn")
	system.Root.Send(pid, 4)
	system.Root.Send(pid, 5)

	captured := make(chan []any, 1)
	require.NoError(t, mb.Seal(func(saved []any) { captured <- saved }))
	// The run goroutine is blocked inside the turn, so captured cannot have run.
	select {
	case <-captured:
		t.Fatal("captured ran while a turn was in progress")
	default:
	}
	require.Equal(t, Open, mb.Mode(), "the switch to Sealed happens when the turn ends")
	require.Equal(t, 5, mb.UserMessageCount())

	close(g2.release)
	saved := recv(t, captured, "captured after the turn ended")
	require.Equal(t, anys(seq(1, 6)), saved, "saved work: unprocessed messages in posting order")
	require.Equal(t, Sealed, mb.Mode())
	require.Equal(t, 0, mb.UserMessageCount(), "saved work was removed from the mailbox")

	system.Root.Send(pid, 6)
	system.Root.Send(pid, 7)
	var seen []any
	held := -1
	doSync(t, mb, func() {
		seen = rec.snapshot()
		held = mb.UserMessageCount()
	})
	require.Empty(t, only(seen, isInt), "nothing dispatched after the seal")
	require.Equal(t, 2, held, "posts after the seal are held")

	// If 6 or 7 had been dispatched while sealed they would precede 1..5.
	require.NoError(t, mb.Unseal(saved))
	got := rec.waitFor(t, "seven numbers", countOf(7, isInt))
	require.Equal(t, seq(1, 8), ints(only(got, isInt)))
	require.Equal(t, []any{g1, gateDone{}, g2, gateDone{}, 1}, got[1:6],
		"the blocked turns finished before any later message")
}

// TestSealSavedWorkKeepsEnvelopes: saved work holds the original posted
// values — *actor.MessageEnvelope with Sender and Header intact (requests
// from RequestFuture and RequestWithCustomSender, envelopes with headers) —
// and, put back with Unseal, the requests are answered to their original
// reply routes.
// Reference: PROTOCOL.md §5.4, §5.5
func TestSealSavedWorkKeepsEnvelopes(t *testing.T) {
	system := newSystem(t)
	headers := &recorder{}
	pid, mb := spawn(t, system, func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *gate:
			msg.hold()
		case string:
			h := ""
			if hd := ctx.MessageHeader(); hd != nil { // nil for a plain (non-envelope) message
				h = hd.Get("k")
			}
			headers.add(msg + ":" + h)
			if ctx.Sender() != nil {
				ctx.Respond(msg + "-reply")
			}
		}
	})
	replies := &recorder{}
	probe := system.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if s, ok := ctx.Message().(string); ok {
			replies.add(s)
		}
	}))

	g := newGate()
	system.Root.Send(pid, g)
	recv(t, g.entered, "handler to enter its turn")

	future := system.Root.RequestFuture(pid, "a", patience(t))
	system.Root.RequestWithCustomSender(pid, "b", probe)
	envC := &actor.MessageEnvelope{Header: map[string]string{"k": "vc"}, Message: "c", Sender: probe}
	system.Root.Send(pid, envC)
	envD := &actor.MessageEnvelope{Message: "d"}
	envD.SetHeader("k", "vd")
	system.Root.Send(pid, envD)
	system.Root.Send(pid, "e")

	captured := make(chan []any, 1)
	require.NoError(t, mb.Seal(func(saved []any) { captured <- saved }))
	close(g.release)
	saved := recv(t, captured, "captured")
	require.Len(t, saved, 5)

	a, ok := saved[0].(*actor.MessageEnvelope)
	require.True(t, ok, "RequestFuture posts an envelope; got %T", saved[0])
	require.Equal(t, "a", a.Message)
	require.True(t, a.Sender.Equal(future.PID()), "sender is the future's PID")

	b, ok := saved[1].(*actor.MessageEnvelope)
	require.True(t, ok, "RequestWithCustomSender posts an envelope; got %T", saved[1])
	require.Equal(t, "b", b.Message)
	require.True(t, b.Sender.Equal(probe))

	require.Same(t, envC, saved[2], "the original envelope value, not a copy")
	require.Equal(t, "vc", saved[2].(*actor.MessageEnvelope).GetHeader("k"))
	require.True(t, saved[2].(*actor.MessageEnvelope).Sender.Equal(probe))
	require.Same(t, envD, saved[3])
	require.Equal(t, "vd", saved[3].(*actor.MessageEnvelope).GetHeader("k"))
	require.Equal(t, "e", saved[4], "a plain Send stays a plain value")

	require.NoError(t, mb.Unseal(saved))
	res, err := future.Result()
	require.NoError(t, err)
	require.Equal(t, "a-reply", res, "reply reached the original future")
	got := replies.waitFor(t, "replies to the custom sender", countOf(2, func(any) bool { return true }))
	require.ElementsMatch(t, []any{"b-reply", "c-reply"}, got)
	hs := headers.waitFor(t, "five strings", countOf(5, func(any) bool { return true }))
	require.Equal(t, []any{"a:", "b:", "c:vc", "d:vd", "e:"}, hs, "headers reach the handler, in order")
}

// TestSystemMessagesRunWhileSealed: while Sealed, system messages are still
// processed — a watched child's Terminated reaches the actor, and a Stop of
// the actor itself is processed (StopFuture's Watch answers) — while user
// messages stay held.
// Reference: PROTOCOL.md §5.4; the package comment ("Lifecycle messages")
func TestSystemMessagesRunWhileSealed(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	childCh := make(chan *actor.PID, 1)
	pid, mb := spawn(t, system, func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			childCh <- ctx.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		}
		rec.add(ctx.Message())
	})
	child := recv(t, childCh, "child spawned")

	require.Empty(t, sealSync(t, mb))
	system.Root.Send(pid, 1)
	system.Root.Send(pid, 2)

	system.Root.Stop(child)
	got := rec.waitFor(t, "the child's Terminated", countOf(1, func(v any) bool {
		term, ok := v.(*actor.Terminated)
		return ok && term.Who.Equal(child)
	}))
	require.Empty(t, only(got, isInt), "user messages stay held")
	require.Equal(t, Sealed, mb.Mode())
	require.Equal(t, 2, mb.UserMessageCount())

	require.NoError(t, system.Root.StopFuture(pid).Wait(), "Stop and Watch are processed while sealed")
	got = rec.waitFor(t, "Stopped", countOf(1, func(v any) bool { _, ok := v.(*actor.Stopped); return ok }))
	require.NotEmpty(t, only(got, func(v any) bool { _, ok := v.(*actor.Stopping); return ok }))
	require.Empty(t, only(got, isInt), "stopping does not dispatch held user messages")
	require.Equal(t, Sealed, mb.Mode())
}

// TestSuspendResumeMailboxPausesUserDispatch: in Open mode SuspendMailbox
// stops user messages and Do items (system messages keep running) until
// ResumeMailbox, after which they run in order — the mailbox handles both
// itself, as Proto.Actor's default mailbox does.
// Reference: the package comment (Open mode behaves like Proto.Actor's default mailbox)
func TestSuspendResumeMailboxPausesUserDispatch(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))

	g := newGate()
	system.Root.Send(pid, g)
	recv(t, g.entered, "handler to enter its turn")
	mb.PostSystemMessage(&actor.SuspendMailbox{})
	for i := range 5 {
		system.Root.Send(pid, i)
	}
	require.NoError(t, mb.Do(func() { rec.add("do") }))
	close(g.release)

	// A system message still runs while suspended: Proto.Actor forwards a
	// Terminated (here from an unrelated PID) to Receive.
	isTerm := func(v any) bool { _, ok := v.(*actor.Terminated); return ok }
	for round := 1; round <= 2; round++ {
		mb.PostSystemMessage(&actor.Terminated{Who: system.NewLocalPID("not-a-child")})
		got := rec.waitFor(t, "Terminated while suspended", countOf(round, isTerm))
		require.Empty(t, only(got, isInt), "no user message while suspended")
		require.NotContains(t, got, "do", "no Do item while suspended")
		require.Equal(t, 5, mb.UserMessageCount())
	}

	mb.PostSystemMessage(&actor.ResumeMailbox{})
	got := rec.waitFor(t, "five numbers after resume", countOf(5, isInt))
	after := only(got, func(v any) bool { return isInt(v) || v == "do" })
	require.Equal(t, []any{"do", 0, 1, 2, 3, 4}, after, "Do before the next user message, then posting order")
}

// TestUnsealRestoresSavedPrefixThenHeldInPostingOrder: with a single poster,
// saved work put back by Unseal is dispatched first, then the messages held
// while sealed, then later posts: exactly the posting order.
// Reference: PROTOCOL.md §6.2
func TestUnsealRestoresSavedPrefixThenHeldInPostingOrder(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))

	g := newGate()
	system.Root.Send(pid, g)
	recv(t, g.entered, "handler to enter its turn")
	for i := range 100 {
		system.Root.Send(pid, i)
	}
	captured := make(chan []any, 1)
	require.NoError(t, mb.Seal(func(saved []any) { captured <- saved }))
	close(g.release)
	saved := recv(t, captured, "captured")
	require.Equal(t, anys(seq(0, 100)), saved)

	for i := 100; i < 200; i++ {
		system.Root.Send(pid, i)
	}
	require.Equal(t, 100, mb.UserMessageCount())
	require.NoError(t, mb.Unseal(saved))
	require.Equal(t, Open, mb.Mode())
	for i := 200; i < 300; i++ {
		system.Root.Send(pid, i)
	}
	got := rec.waitFor(t, "300 numbers", countOf(300, isInt))
	require.Equal(t, seq(0, 300), ints(only(got, isInt)))
}

// TestUnsealKeepsPerPosterOrder: with several concurrent posters and a Seal
// and Unseal in the middle of the stream, every poster's messages are
// dispatched exactly once and in its posting order, and the saved work is,
// per poster, a contiguous run.
// Reference: PROTOCOL.md §6.2, §10 (order per sender)
func TestUnsealKeepsPerPosterOrder(t *testing.T) {
	const posters, per = 4, 3000
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))

	progress := make(chan struct{}, posters)
	var wg sync.WaitGroup
	for p := range posters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				system.Root.Send(pid, num{p, i})
				if i == per/4 {
					progress <- struct{}{}
				}
			}
		}()
	}
	for range posters {
		recv(t, progress, "posters to make progress")
	}
	saved := sealSync(t, mb)
	requirePerPosterContiguous(t, saved, posters)
	require.NoError(t, mb.Unseal(saved))
	waitWG(t, &wg, "posters")

	got := rec.waitFor(t, "all messages", countOf(posters*per, isNum))
	requirePerPosterOrder(t, got, posters, per)
}

// requirePerPosterContiguous checks that items' nums are, per poster, a
// contiguous run in increasing order (what was not yet dispatched).
func requirePerPosterContiguous(t *testing.T, items []any, posters int) {
	t.Helper()
	next := make([]int, posters)
	for p := range next {
		next[p] = -1
	}
	for _, it := range items {
		n := it.(num)
		if next[n.p] >= 0 {
			require.Equal(t, next[n.p], n.i, "poster %d", n.p)
		}
		next[n.p] = n.i + 1
	}
}

// TestRedirectDrainsHeldInOrderThenForwardsNewPosts: Redirect hands every
// held message to the sink in posting order, returns how many, and then
// forwards each later post; nothing reaches the actor.
// Reference: PROTOCOL.md §5.8
func TestRedirectDrainsHeldInOrderThenForwardsNewPosts(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))
	require.Empty(t, sealSync(t, mb))

	for i := range 100 {
		system.Root.Send(pid, i)
	}
	var got []any
	n, err := mb.Redirect(func(msg any) { got = append(got, msg) })
	require.NoError(t, err)
	require.Equal(t, 100, n)
	require.Equal(t, seq(0, 100), ints(got))
	require.Equal(t, Redirecting, mb.Mode())
	require.Equal(t, 0, mb.UserMessageCount())

	for i := 100; i < 200; i++ {
		system.Root.Send(pid, i) // the sink runs synchronously in the post
	}
	require.Equal(t, seq(0, 200), ints(got))

	var seen []any
	doSync(t, mb, func() { seen = rec.snapshot() })
	require.Empty(t, only(seen, isInt), "redirected messages are not dispatched")
}

// TestRedirectSinkSwapPartitionsPostingOrder: with 4 concurrent posters of
// 10k messages each, a Redirect from Sealed and a later sink swap partition
// every poster's sequence exactly — the first sink gets a prefix (starting
// with the held messages), the second the rest; nothing is lost, duplicated
// or reordered; every message whose post completed before a Redirect call is
// on the old side, and every one posted after the swap returned is on the new.
// Reference: PROTOCOL.md §5.8
func TestRedirectSinkSwapPartitionsPostingOrder(t *testing.T) {
	const posters, per = 4, 10000
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))
	require.Empty(t, sealSync(t, mb))

	var (
		completed   [posters]atomic.Int64 // posts returned, per poster
		firstAfter  [posters]int          // first index posted after seeing swapped; written by its poster
		swappedFlag atomic.Bool
		quarter     = make(chan struct{}, posters)
		half        = make(chan struct{}, posters)
		swapped     = make(chan struct{})
		wg          sync.WaitGroup
	)
	for p := range posters {
		firstAfter[p] = -1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if firstAfter[p] < 0 && swappedFlag.Load() {
					firstAfter[p] = i
				}
				system.Root.Send(pid, num{p, i})
				completed[p].Store(int64(i + 1))
				switch i {
				case per / 4:
					quarter <- struct{}{}
				case per / 2:
					half <- struct{}{}
				case 3 * per / 4:
					<-swapped // guarantee a tail posted after the swap
				}
			}
		}()
	}

	var sinkA, sinkB []any // appended under the mailbox lock
	for range posters {
		recv(t, quarter, "posters at 1/4")
	}
	var beforeRedirect [posters]int64
	for p := range posters {
		beforeRedirect[p] = completed[p].Load()
	}
	held, err := mb.Redirect(func(msg any) { sinkA = append(sinkA, msg) })
	require.NoError(t, err)

	for range posters {
		recv(t, half, "posters at 1/2")
	}
	var beforeSwap [posters]int64
	for p := range posters {
		beforeSwap[p] = completed[p].Load()
	}
	n, err := mb.Redirect(func(msg any) { sinkB = append(sinkB, msg) })
	require.NoError(t, err)
	require.Equal(t, 0, n, "a swap drains nothing: nothing is held while Redirecting")
	swappedFlag.Store(true)
	close(swapped)
	waitWG(t, &wg, "posters")

	all := append(append([]any(nil), sinkA...), sinkB...)
	requirePerPosterOrder(t, all, posters, per)
	require.GreaterOrEqual(t, len(sinkA), held)
	require.NotEmpty(t, sinkB)

	countIn := func(items []any, p int) int64 {
		c := int64(0)
		for _, it := range items {
			if it.(num).p == p {
				c++
			}
		}
		return c
	}
	for p := range posters {
		require.GreaterOrEqual(t, countIn(sinkA[:held], p), beforeRedirect[p],
			"poster %d: posts completed before Redirect were held and drained first", p)
		require.GreaterOrEqual(t, countIn(sinkA, p), beforeSwap[p],
			"poster %d: posts completed before the swap went to the old sink", p)
		require.GreaterOrEqual(t, firstAfter[p], 0)
		require.LessOrEqual(t, countIn(sinkA, p), int64(firstAfter[p]),
			"poster %d: posts made after the swap returned went to the new sink", p)
	}
	require.Equal(t, Redirecting, mb.Mode())

	var seen []any
	doSync(t, mb, func() { seen = rec.snapshot() })
	require.Empty(t, only(seen, isNum), "nothing was dispatched")
}

// TestStagingHoldsUserMessagesButStartedArrives: a mailbox created Staging
// dispatches no user message (they wait in the temporary queue) while the
// actor still receives *actor.Started, which Proto.Actor posts as a system
// message and forwards to Receive from InvokeSystemMessage.
// Reference: PROTOCOL.md §5.7
func TestStagingHoldsUserMessagesButStartedArrives(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec), StartStaging())
	require.Equal(t, Staging, mb.Mode())

	rec.waitFor(t, "Started in Staging", countOf(1, isStarted))
	for i := range 10 {
		system.Root.Send(pid, i)
	}
	var seen []any
	doSync(t, mb, func() { seen = rec.snapshot() })
	require.Equal(t, []any{&actor.Started{}}, seen, "only Started reached Receive")
	require.Equal(t, 10, mb.UserMessageCount(), "posts wait in the temporary queue")
	require.Equal(t, Staging, mb.Mode())
}

// TestOpenWithDispatchesBacklogThenTemporaryQueueThenNewPosts: OpenWith
// dispatches the backlog in its order, then what was posted while Staging,
// then later posts.
// Reference: PROTOCOL.md §5.12
func TestOpenWithDispatchesBacklogThenTemporaryQueueThenNewPosts(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec), StartStaging())

	for i := 100; i < 110; i++ {
		system.Root.Send(pid, i)
	}
	require.NoError(t, mb.OpenWith(anys(seq(0, 100))))
	require.Equal(t, Open, mb.Mode())
	for i := 110; i < 120; i++ {
		system.Root.Send(pid, i)
	}
	got := rec.waitFor(t, "120 numbers", countOf(120, isInt))
	require.Equal(t, seq(0, 120), ints(only(got, isInt)))
	require.True(t, isStarted(got[0]), "Started came first")
}

// TestOpenWithBacklogFirstUnderConcurrentPosts: with posters racing OpenWith,
// every backlog item is dispatched before any posted message, and each
// poster's messages keep their order.
// Reference: PROTOCOL.md §5.12
func TestOpenWithBacklogFirstUnderConcurrentPosts(t *testing.T) {
	const rounds, posters, per, backlog = 20, 4, 500, 200
	system := newSystem(t)
	for range rounds {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec), StartStaging())
		progress := make(chan struct{}, posters)
		var wg sync.WaitGroup
		for p := range posters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					system.Root.Send(pid, num{p, i})
					if i == per/10 {
						progress <- struct{}{}
					}
				}
			}()
		}
		recv(t, progress, "a poster to make progress") // the race is on with the rest
		require.NoError(t, mb.OpenWith(anys(seq(0, backlog))))
		waitWG(t, &wg, "posters")

		got := rec.waitFor(t, "all messages", countOf(posters*per, isNum))
		user := only(got, func(v any) bool { return isInt(v) || isNum(v) })
		require.Equal(t, seq(0, backlog), ints(user[:backlog]), "backlog first, in order")
		require.Empty(t, only(user[backlog:], isInt))
		requirePerPosterOrder(t, user, posters, per)
		system.Root.Stop(pid)
	}
}

// TestDoRunsBetweenTurnsInOrderInEveryMode: Do items run on the run
// goroutine between turns — never during a turn in progress — in submission
// order, before the next user message, also in Staging and Sealed; a Do
// submitted after Discard returns ErrMode and does not run.
// Reference: PROTOCOL.md §5.5, §5.7 (capture and restore between turns)
func TestDoRunsBetweenTurnsInOrderInEveryMode(t *testing.T) {
	system := newSystem(t)

	t.Run("Open", func(t *testing.T) {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec))
		g := newGate()
		system.Root.Send(pid, g)
		recv(t, g.entered, "handler to enter its turn")
		system.Root.Send(pid, 1)
		for i := range 3 {
			require.NoError(t, mb.Do(func() { rec.add(string(rune('a' + i))) }))
		}
		require.Empty(t, only(rec.snapshot(), func(v any) bool { _, ok := v.(string); return ok }),
			"no Do during the turn in progress")
		close(g.release)
		got := rec.waitFor(t, "message 1", countOf(1, isInt))
		require.Equal(t, []any{g, gateDone{}, "a", "b", "c", 1}, got[1:], "turn, Do items in order, next message")
	})

	t.Run("Staging", func(t *testing.T) {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec), StartStaging())
		system.Root.Send(pid, 1)
		var order []int
		for i := range 100 {
			require.NoError(t, mb.Do(func() { order = append(order, i) }))
		}
		var seen []any
		doSync(t, mb, func() { seen = rec.snapshot() })
		require.Equal(t, seq(0, 100), order, "Do items in submission order")
		require.Empty(t, only(seen, isInt))
		require.Equal(t, Staging, mb.Mode())
	})

	t.Run("SealedThenClosed", func(t *testing.T) {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec))
		require.Empty(t, sealSync(t, mb))
		system.Root.Send(pid, 1)
		var seen []any
		doSync(t, mb, func() { seen = rec.snapshot() })
		require.Empty(t, only(seen, isInt))
		require.Equal(t, 1, mb.UserMessageCount())

		_, err := mb.Discard()
		require.NoError(t, err)
		ran := false
		err = mb.Do(func() { ran = true })
		require.ErrorIs(t, err, ErrMode)
		require.Contains(t, err.Error(), "Closed")
		// A later Do cannot be accepted either, so there is nothing to flush;
		// ran is only written by a Do that was (wrongly) accepted.
		require.False(t, ran)
	})
}

// TestDiscardReturnsHeldInOrderAndLaterPostsGoToClosedHandler: Discard from
// Staging, Sealed or Redirecting switches to Closed and returns what the
// mailbox held (temporary queue or ingress hold) in order; later posts go to
// the OnClosed handler (or are dropped and counted), never to the actor or
// the old sink.
// Reference: PROTOCOL.md §6.3
func TestDiscardReturnsHeldInOrderAndLaterPostsGoToClosedHandler(t *testing.T) {
	system := newSystem(t)

	t.Run("Staging", func(t *testing.T) {
		var closed []any // OnClosed runs synchronously on the posting goroutine
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec), StartStaging(),
			OnClosed(func(msg any) { closed = append(closed, msg) }))
		for i := range 10 {
			system.Root.Send(pid, i)
		}
		out, err := mb.Discard()
		require.NoError(t, err)
		require.Equal(t, seq(0, 10), ints(out))
		require.Equal(t, Closed, mb.Mode())
		require.Equal(t, 0, mb.UserMessageCount())

		system.Root.Send(pid, 10)
		system.Root.Send(pid, 11)
		require.Equal(t, []any{10, 11}, closed)
		require.Zero(t, mb.Dropped())
		require.Empty(t, only(rec.snapshot(), isInt))
	})

	t.Run("SealedDefaultHandlerDropsAndCounts", func(t *testing.T) {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec))
		require.Empty(t, sealSync(t, mb))
		for i := range 5 {
			system.Root.Send(pid, i)
		}
		out, err := mb.Discard()
		require.NoError(t, err)
		require.Equal(t, seq(0, 5), ints(out))
		system.Root.Send(pid, 5)
		system.Root.Send(pid, 6)
		require.Equal(t, uint64(2), mb.Dropped())
		require.Equal(t, 0, mb.UserMessageCount())
	})

	t.Run("Redirecting", func(t *testing.T) {
		var closed, sunk []any
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec), OnClosed(func(msg any) { closed = append(closed, msg) }))
		require.Empty(t, sealSync(t, mb))
		_, err := mb.Redirect(func(msg any) { sunk = append(sunk, msg) })
		require.NoError(t, err)
		system.Root.Send(pid, 0)
		out, err := mb.Discard()
		require.NoError(t, err)
		require.Empty(t, out, "nothing is held while Redirecting")
		system.Root.Send(pid, 1)
		require.Equal(t, []any{0}, sunk)
		require.Equal(t, []any{1}, closed)
	})
}

// TestModeErrorsChangeNothing: every operation called from a mode that does
// not allow it returns ErrMode (naming the mode) and changes neither the mode
// nor the held messages, and calls no callback.
// Reference: PROTOCOL.md §10 (bad input changes nothing)
func TestModeErrorsChangeNothing(t *testing.T) {
	system := newSystem(t)
	type op struct {
		name    string
		allowed map[Mode]bool
		call    func(mb *Mailbox, sinkCalls *atomic.Int32) error
	}
	ops := []op{
		{"Seal", map[Mode]bool{Open: true}, func(mb *Mailbox, c *atomic.Int32) error {
			return mb.Seal(func([]any) { c.Add(1) })
		}},
		{"Unseal", map[Mode]bool{Sealed: true}, func(mb *Mailbox, _ *atomic.Int32) error {
			return mb.Unseal([]any{"x"})
		}},
		{"Redirect", map[Mode]bool{Sealed: true, Redirecting: true}, func(mb *Mailbox, c *atomic.Int32) error {
			_, err := mb.Redirect(func(any) { c.Add(1) })
			return err
		}},
		{"OpenWith", map[Mode]bool{Staging: true}, func(mb *Mailbox, _ *atomic.Int32) error {
			return mb.OpenWith([]any{"x"})
		}},
		{"Discard", map[Mode]bool{Staging: true, Sealed: true, Redirecting: true}, func(mb *Mailbox, _ *atomic.Int32) error {
			_, err := mb.Discard()
			return err
		}},
		{"Do", map[Mode]bool{Open: true, Sealed: true, Redirecting: true, Staging: true}, func(mb *Mailbox, c *atomic.Int32) error {
			return mb.Do(func() { c.Add(1) })
		}},
	}
	// setups bring a fresh actor's mailbox into each mode, holding `held` messages.
	setups := []struct {
		mode Mode
		held int
		make func(t *testing.T) (*actor.PID, *Mailbox)
	}{
		{Open, 0, func(t *testing.T) (*actor.PID, *Mailbox) {
			return spawn(t, system, recordingActor(&recorder{}))
		}},
		{Sealed, 2, func(t *testing.T) (*actor.PID, *Mailbox) {
			pid, mb := spawn(t, system, recordingActor(&recorder{}))
			sealSync(t, mb)
			system.Root.Send(pid, 1)
			system.Root.Send(pid, 2)
			return pid, mb
		}},
		{Redirecting, 0, func(t *testing.T) (*actor.PID, *Mailbox) {
			pid, mb := spawn(t, system, recordingActor(&recorder{}))
			sealSync(t, mb)
			_, err := mb.Redirect(func(any) {})
			require.NoError(t, err)
			return pid, mb
		}},
		{Staging, 2, func(t *testing.T) (*actor.PID, *Mailbox) {
			pid, mb := spawn(t, system, recordingActor(&recorder{}), StartStaging())
			system.Root.Send(pid, 1)
			system.Root.Send(pid, 2)
			return pid, mb
		}},
		{Closed, 0, func(t *testing.T) (*actor.PID, *Mailbox) {
			pid, mb := spawn(t, system, recordingActor(&recorder{}), StartStaging())
			_, err := mb.Discard()
			require.NoError(t, err)
			return pid, mb
		}},
	}
	for _, s := range setups {
		t.Run(s.mode.String(), func(t *testing.T) {
			_, mb := s.make(t)
			for _, o := range ops {
				if o.allowed[s.mode] {
					continue
				}
				var calls atomic.Int32
				err := o.call(mb, &calls)
				require.ErrorIsf(t, err, ErrMode, "%s from %s", o.name, s.mode)
				require.Contains(t, err.Error(), s.mode.String())
				require.Contains(t, err.Error(), o.name)
				require.Equal(t, s.mode, mb.Mode(), "%s changed the mode", o.name)
				require.Equal(t, s.held, mb.UserMessageCount(), "%s changed the held messages", o.name)
				require.Zero(t, calls.Load(), "%s called its callback", o.name)
			}
		})
	}

	t.Run("SealPending", func(t *testing.T) {
		rec := &recorder{}
		pid, mb := spawn(t, system, recordingActor(rec))
		g := newGate()
		system.Root.Send(pid, g)
		recv(t, g.entered, "handler to enter its turn")
		system.Root.Send(pid, 1)
		captured := make(chan []any, 1)
		require.NoError(t, mb.Seal(func(saved []any) { captured <- saved }))

		err := mb.Seal(func([]any) { t.Error("second captured ran") })
		require.ErrorIs(t, err, ErrMode, "a second Seal while one is pending")
		require.Contains(t, err.Error(), "pending")
		for _, o := range ops {
			if o.name == "Seal" || o.name == "Do" {
				continue
			}
			err := o.call(mb, &atomic.Int32{})
			require.ErrorIsf(t, err, ErrMode, "%s while a seal is pending", o.name)
			require.Equal(t, Open, mb.Mode())
			require.Equal(t, 1, mb.UserMessageCount())
		}
		close(g.release)
		require.Equal(t, []any{1}, recv(t, captured, "captured"))
		require.Equal(t, Sealed, mb.Mode())
	})

	t.Run("NilCallbacks", func(t *testing.T) {
		_, mb := spawn(t, system, recordingActor(&recorder{}))
		require.Error(t, mb.Seal(nil))
		require.Error(t, mb.Do(nil))
		_, err := mb.Redirect(nil)
		require.Error(t, err)
		require.False(t, errors.Is(mb.Seal(nil), ErrMode))
		require.Equal(t, Open, mb.Mode())
	})
}

// TestPanicInUserMessageEscalatesAndLaterMessagesRun: a panicking handler is
// escalated through invoker.EscalateFailure, the default supervisor strategy
// restarts the actor (Restarting, then a new Started), and the messages
// posted after the failing one still run, in order.
// Reference: the package comment (panics escalate as with Proto.Actor's default mailbox)
func TestPanicInUserMessageEscalatesAndLaterMessagesRun(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, _ := spawn(t, system, func(ctx actor.Context) {
		if ctx.Message() == "boom" {
			panic("boom")
		}
		rec.add(ctx.Message())
	})
	system.Root.Send(pid, 1)
	system.Root.Send(pid, "boom")
	system.Root.Send(pid, 2)
	system.Root.Send(pid, 3)

	got := rec.waitFor(t, "three numbers", countOf(3, isInt))
	require.Equal(t, []any{&actor.Started{}, 1, &actor.Restarting{}, &actor.Started{}, 2, 3}, got)
}

// TestPanicInDoEscalatesAndLaterMessagesRun: a panicking Do function is
// escalated like a failing turn; the actor restarts and later messages run.
// Reference: the package comment (panics escalate as with Proto.Actor's default mailbox)
func TestPanicInDoEscalatesAndLaterMessagesRun(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))
	rec.waitFor(t, "Started", countOf(1, isStarted))
	require.NoError(t, mb.Do(func() { panic("do-boom") }))
	system.Root.Send(pid, 1)

	got := rec.waitFor(t, "message 1", countOf(1, isInt))
	require.Equal(t, []any{&actor.Started{}, &actor.Restarting{}, &actor.Started{}, 1}, got)
}

type testBatch struct{ msgs []any }

func (b *testBatch) GetMessages() []any { return b.msgs }

// TestMessageBatchExpandsLikeDefaultMailbox: a MessageBatch, raw or inside
// an envelope, is expanded at post time exactly as Proto.Actor's default
// mailbox does — each element, then the batch value itself — so the actor
// sees the same sequence with either mailbox, and saved work holds that
// expanded sequence.
// Reference: the package comment (Open mode behaves like Proto.Actor's default mailbox)
func TestMessageBatchExpandsLikeDefaultMailbox(t *testing.T) {
	system := newSystem(t)
	raw := &testBatch{msgs: []any{1, 2}}
	env := &actor.MessageEnvelope{Message: &testBatch{msgs: []any{3, 4}}}
	keep := func(v any) bool { _, b := v.(*testBatch); return isInt(v) || b || v == "end" }

	run := func(props *actor.Props, rec *recorder) []any {
		pid := system.Root.Spawn(props)
		t.Cleanup(func() { system.Root.Stop(pid) })
		system.Root.Send(pid, raw)
		system.Root.Send(pid, env)
		system.Root.Send(pid, "end")
		return only(rec.waitFor(t, "end", countOf(1, func(v any) bool { return v == "end" })), keep)
	}
	defRec, ourRec := &recorder{}, &recorder{}
	want := run(actor.PropsFromFunc(recordingActor(defRec)), defRec)
	got := run(actor.PropsFromFunc(recordingActor(ourRec), actor.WithMailbox(Producer(nil))), ourRec)
	require.Equal(t, want, got)
	require.Equal(t, []any{1, 2, raw, 3, 4, env.Message, "end"}, got)

	pid, mb := spawn(t, system, recordingActor(&recorder{}))
	require.Empty(t, sealSync(t, mb))
	system.Root.Send(pid, raw)
	system.Root.Send(pid, env)
	held, err := mb.Discard()
	require.NoError(t, err)
	require.Equal(t, []any{1, 2, raw, 3, 4, env}, held)
}

// Reopen returns a redirected mailbox to dispatch with the parked messages
// first, in order, ahead of every later post.
// Reference: PROTOCOL.md §6.4 (explicit failure while reconciling).
func TestReopenPutsParkedMessagesFirst(t *testing.T) {
	var got []int
	done := make(chan struct{})
	mb := New()
	sys := actor.NewActorSystem()
	props := actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			got = append(got, v)
			if v == 6 {
				close(done)
			}
		}
	}, actor.WithMailbox(func() actor.Mailbox { return mb }))
	pid := sys.Root.Spawn(props)
	sealed := make(chan []any, 1)
	require.NoError(t, mb.Seal(func(saved []any) { sealed <- saved }))
	saved := <-sealed
	var parked []any
	_, err := mb.Redirect(func(msg any) { parked = append(parked, msg) })
	require.NoError(t, err)
	sys.Root.Send(pid, 2)
	sys.Root.Send(pid, 3)
	require.Error(t, mb.Unseal(nil), "Unseal is for Sealed only")
	require.NoError(t, mb.Reopen(func() []any { return append(append(saved, 1), parked...) }))
	for i := 4; i <= 6; i++ {
		sys.Root.Send(pid, i)
	}
	select {
	case <-done:
	case <-time.After(patience(t)):
		t.Fatal("not dispatched")
	}
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, got)
	require.ErrorIs(t, mb.Reopen(func() []any { return nil }), ErrMode)
}

// TestGateHoldsUserMessagesUntilWake: while the gate is shut, no user
// message is dispatched (the batch in hand included) and they keep their
// order; system messages and Do items still run; Wake after the gate opens
// dispatches them in posting order. This is the owner-lease fence.
// Reference: PROTOCOL.md §10 (one owner at a time), docs/FAULTS.md ("Fenced means inert")
func TestGateHoldsUserMessagesUntilWake(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	var open atomic.Bool
	open.Store(true)
	pid, mb := spawn(t, system, recordingActor(rec), Gate(open.Load))

	g := newGate()
	system.Root.Send(pid, g)
	recv(t, g.entered, "handler to enter its turn")
	for i := range 5 {
		system.Root.Send(pid, i) // queued behind the turn: the batch in hand
	}
	open.Store(false)
	close(g.release)
	require.NoError(t, mb.Do(func() { rec.add("do") }))
	got := rec.waitFor(t, "the Do item while gated", func(items []any) bool { return slices.Contains(items, any("do")) })
	isTerm := func(v any) bool { _, ok := v.(*actor.Terminated); return ok }
	mb.PostSystemMessage(&actor.Terminated{Who: system.NewLocalPID("not-a-child")})
	got = rec.waitFor(t, "Terminated while gated", countOf(1, isTerm))
	require.Empty(t, only(got, isInt), "no user message while gated")
	require.Equal(t, 5, mb.UserMessageCount())

	open.Store(true)
	mb.Wake()
	got = rec.waitFor(t, "five numbers after Wake", countOf(5, isInt))
	require.Equal(t, seq(0, 5), ints(only(got, isInt)))
}

// TestSealFinalRunsWhileSuspended: an incarnation that ends (its lifecycle
// ended, or it closes) is sealed even while its actor is suspended (a failure awaiting a restart
// that fails again, for ever): the Do items before it and the seal run,
// with the queued user messages as its saved work, and no user message is
// dispatched. A plain Seal waits for the resume, as a move must (it
// captures the actor's state).
// Reference: PROTOCOL.md §3.4 (an ended lifecycle fails what it holds).
func TestSealFinalRunsWhileSuspended(t *testing.T) {
	system := newSystem(t)
	rec := &recorder{}
	pid, mb := spawn(t, system, recordingActor(rec))
	g := newGate()
	system.Root.Send(pid, g)
	recv(t, g.entered, "handler to enter its turn")
	mb.PostSystemMessage(&actor.SuspendMailbox{})
	for i := range 3 {
		system.Root.Send(pid, i)
	}
	require.NoError(t, mb.Do(func() { rec.add("do") }))
	sealed := make(chan []any, 1)
	require.NoError(t, mb.SealFinal(func(saved []any) { sealed <- saved }))
	close(g.release)

	var saved []any
	select {
	case saved = <-sealed:
	case <-time.After(patience(t)):
		t.Fatal("the ended seal waited for the suspended actor's resume")
	}
	require.Len(t, saved, 3, "the queued user messages are the saved work")
	require.Equal(t, Sealed, mb.Mode())
	got := rec.waitFor(t, "the Do item before the seal", func(v []any) bool { return slices.Contains(v, "do") })
	require.Empty(t, only(got, isInt), "no user message dispatched")

	// A plain Seal of a suspended actor waits for its resume.
	rec2 := &recorder{}
	pid2, mb2 := spawn(t, system, recordingActor(rec2))
	g2 := newGate()
	system.Root.Send(pid2, g2)
	recv(t, g2.entered, "second handler to enter its turn")
	mb2.PostSystemMessage(&actor.SuspendMailbox{})
	sealed2 := make(chan []any, 1)
	require.NoError(t, mb2.Seal(func(saved []any) { sealed2 <- saved }))
	close(g2.release)
	// The run loop goes round (a system message runs while suspended) and
	// leaves the seal queued.
	isTerm := func(v any) bool { _, ok := v.(*actor.Terminated); return ok }
	mb2.PostSystemMessage(&actor.Terminated{Who: system.NewLocalPID("not-a-child")})
	rec2.waitFor(t, "Terminated while suspended", countOf(1, isTerm))
	require.Empty(t, sealed2, "a plain Seal ran while the actor was suspended")
	require.Equal(t, Open, mb2.Mode())
	mb2.PostSystemMessage(&actor.ResumeMailbox{})
	<-sealed2
}

// An idle mailbox keeps no buffer of the smallest size: most objects are
// idle, and one such buffer each was about 64 bytes of every idle Spot's
// heap. A buffer a burst made larger is kept for the next burst.
func TestAnIdleMailboxKeepsNoSmallBuffer(t *testing.T) {
	system := newSystem(t)
	var rec recorder
	release := make(chan struct{})
	pid, m := spawn(t, system, func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			if v == 0 {
				<-release // the burst queues behind the first message
			}
			rec.add(v)
		}
	})
	buffers := func() (user, out int) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.user.buf), len(m.out.buf)
	}
	idle := func() bool { return m.status.Load() == idle && m.userCount.Load() == 0 }

	system.Root.Send(pid, 1)
	rec.waitFor(t, "the first message", func(items []any) bool { return len(items) == 1 })
	testwait.For(t, idle, "the mailbox idle after one message")
	user, out := buffers()
	require.Zero(t, user+out, "an idle mailbox that held one message keeps no buffer")

	system.Root.Send(pid, 0)
	for i := 2; i < 2+3*ringMinCap; i++ {
		system.Root.Send(pid, i)
	}
	close(release)
	rec.waitFor(t, "the burst", func(items []any) bool { return len(items) == 2+3*ringMinCap })
	testwait.For(t, idle, "the mailbox idle after the burst")
	user, out = buffers()
	require.Greater(t, user, ringMinCap, "the burst's buffer is kept for the next one")
	require.Zero(t, out, "one buffer, not one per ring")
}

// TestAMailboxOfAnIdleObjectStaysSmall: every idle object has a mailbox,
// and an object that never moved, never had a Do and never closed keeps
// nothing beyond it (its rare part dropped). 160 bytes is a size class of
// Go's allocator: one field more costs every idle object 16 bytes.
func TestAMailboxOfAnIdleObjectStaysSmall(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(Mailbox{}), uintptr(160))

	system := newSystem(t)
	var rec recorder
	pid, m := spawn(t, system, func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			rec.add(v)
		}
	})
	system.Root.Send(pid, 1)
	rec.waitFor(t, "the message", func(items []any) bool { return len(items) == 1 })
	rare := func() *mailboxRare {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.rare
	}
	require.Nil(t, rare(), "a mailbox that only dispatched makes no rare part")

	// A Do (a checkpoint's capture) needs it while queued, not after.
	ran := make(chan struct{})
	require.NoError(t, m.Do(func() { close(ran) }))
	testwait.Recv(t, ran, "the Do")
	testwait.For(t, func() bool { return rare() == nil }, "the rare part dropped after the Do")

	// A seal, a redirect and a reopen: the same once reopened.
	sealed := make(chan struct{})
	require.NoError(t, m.Seal(func([]any) { close(sealed) }))
	testwait.Recv(t, sealed, "the seal")
	_, err := m.Redirect(func(any) {})
	require.NoError(t, err)
	require.NotNil(t, rare(), "a redirecting mailbox keeps its sink")
	require.NoError(t, m.Reopen(func() []any { return nil }))
	require.Nil(t, rare(), "the rare part dropped once open again")
}
