package machine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/roamerr"
)

// Turns posted from many goroutines run one at a time, each poster's in
// the order it posted them: the machine needs no lock of its own.
func TestLoopRunsTurnsOneAtATimeInPostOrder(t *testing.T) {
	l := machine.NewLoop[string](machine.NewManual())
	defer l.Close()
	const posters, each = 8, 500
	var inTurn atomic.Int32
	overlaps := 0                // written only in turns
	last := make([]int, posters) // written only in turns
	outOfOrder := 0
	var wg sync.WaitGroup
	for p := 0; p < posters; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= each; i++ {
				require.True(t, l.Post(func() {
					if inTurn.Add(1) != 1 {
						overlaps++
					}
					if last[p] != i-1 {
						outOfOrder++
					}
					last[p] = i
					inTurn.Add(-1)
				}))
			}
		}()
	}
	wg.Wait()
	require.NoError(t, l.Do(ctx(t), func() {}))
	require.Zero(t, overlaps, "two turns ran at once")
	require.Zero(t, outOfOrder, "a poster's turns ran out of order")
	for p := range last {
		require.Equal(t, each, last[p])
	}
	testwait.Within(t, 10*time.Second, l.Idle, "the loop idle")
}

// A timer's firing is a turn; re-armed or cancelled before its turn runs,
// it does not run, and the newest arming does.
func TestLoopTimersRunAsTurnsAndOnlyTheNewestArming(t *testing.T) {
	c := machine.NewManual()
	l := machine.NewLoop[string](c)
	defer l.Close()
	var mu sync.Mutex
	var got []string
	add := func(s string) func() {
		return func() { mu.Lock(); got = append(got, s); mu.Unlock() }
	}
	// Hold the loop in a turn so that fired timers queue behind it.
	release := make(chan struct{})
	holding := make(chan struct{})
	l.Post(func() { close(holding); <-release })
	<-holding
	l.Arm("a", time.Second, add("a-old"))
	l.Arm("b", time.Second, add("b"))
	l.Arm("c", time.Second, add("c"))
	c.Advance(time.Second) // all three fired: their turns queue
	l.Arm("a", time.Second, add("a-new"))
	require.True(t, l.Cancel("c"), "c fired, its turn queued: still armed until the turn takes it")
	close(release)
	require.NoError(t, l.Do(ctx(t), func() {}))
	mu.Lock()
	require.Equal(t, []string{"b"}, got, "a re-armed and a cancelled timer's queued firing ran")
	mu.Unlock()
	c.Advance(time.Second)
	require.NoError(t, l.Do(ctx(t), func() {}))
	mu.Lock()
	require.Equal(t, []string{"b", "a-new"}, got)
	mu.Unlock()
}

// Close drops what is queued, cancels the timers, refuses later posts
// with an Unavailable error and lets the turn under way finish; Done
// closes after it.
func TestLoopCloseEndsItsMachine(t *testing.T) {
	c := machine.NewManual()
	l := machine.NewLoop[string](c)
	release := make(chan struct{})
	holding := make(chan struct{})
	var ran atomic.Int32
	l.Post(func() { close(holding); <-release; ran.Add(1) })
	<-holding
	l.Post(func() { ran.Add(10) })
	queued := make(chan error, 1)
	go func() { queued <- l.Do(context.Background(), func() { ran.Add(100) }) }()
	testwait.Within(t, 10*time.Second, func() bool { return l.Pending() == 2 }, "the Do's turn queued")
	l.Arm("t", time.Second, func() { ran.Add(1000) })
	l.Close()
	select {
	case <-l.Done():
		t.Fatal("Done closed while a turn was still running")
	default:
	}
	close(release)
	testwait.Recv(t, l.Done(), "the loop's last turn to return")
	c.Advance(time.Hour)
	require.Equal(t, int32(1), ran.Load(), "only the turn under way ran")
	err := testwait.Recv(t, queued, "the dropped Do's answer")
	require.ErrorIs(t, err, machine.ErrClosed)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.False(t, l.Post(func() {}))
	require.ErrorIs(t, l.Do(context.Background(), func() {}), machine.ErrClosed)
	l.Close() // twice is fine
}

// A turn may close its own loop; Do returns its context's error when the
// context ends first.
func TestLoopClosedFromATurnAndDoContext(t *testing.T) {
	l := machine.NewLoop[string](nil)
	require.NoError(t, l.Do(ctx(t), l.Close))
	testwait.Recv(t, l.Done(), "the loop closed from its own turn")

	l2 := machine.NewLoop[string](nil)
	defer l2.Close()
	release := make(chan struct{})
	defer close(release)
	l2.Post(func() { <-release })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.True(t, errors.Is(l2.Do(ctx, func() {}), context.Canceled))
}

// ctx bounds a Do in a test by the test's patience.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), testwait.Patience(t))
	t.Cleanup(cancel)
	return c
}

// mailbox is a serial executor of the host's own, as a Proto.Actor
// actor's mailbox is: its messages and the loop's turns share one queue.
type mailbox struct{ q chan func() }

func newMailbox(t *testing.T) *mailbox {
	m := &mailbox{q: make(chan func(), 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range m.q {
			f()
		}
	}()
	t.Cleanup(func() { close(m.q); <-done })
	return m
}

func (m *mailbox) exec(turn func()) bool { m.q <- turn; return true }

// A loop on its host's executor runs its turns and timer firings in that
// executor's one queue, in order with the host's own messages; Close
// drops the turns queued there and cancels the timers, Done waits for
// the turn under way; CloseTimers alone leaves turns running.
func TestLoopOnAHostsExecutorSharesItsQueue(t *testing.T) {
	c := machine.NewManual()
	mb := newMailbox(t)
	l := machine.NewLoopOn[string](c, mb.exec)
	var got []string // written on the executor only
	add := func(s string) func() { return func() { got = append(got, s) } }
	l.Post(add("turn 1"))
	mb.exec(add("message"))
	l.Post(add("turn 2"))
	l.Arm("t", time.Second, add("timer"))
	c.Advance(time.Second)
	require.NoError(t, l.Do(ctx(t), func() {}))
	require.Equal(t, []string{"turn 1", "message", "turn 2", "timer"}, got)

	l.CloseTimers()
	l.Arm("t", time.Second, add("timer after CloseTimers"))
	c.Advance(time.Hour)
	require.NoError(t, l.Do(ctx(t), add("turn after CloseTimers")))
	require.Equal(t, "turn after CloseTimers", got[len(got)-1], "turns still run, timers do not")

	release := make(chan struct{})
	holding := make(chan struct{})
	l.Post(func() { close(holding); <-release })
	<-holding
	l.Post(add("dropped"))
	l.Close()
	select {
	case <-l.Done():
		t.Fatal("Done closed while a turn was still running")
	default:
	}
	close(release)
	testwait.Recv(t, l.Done(), "the loop's last turn to return")
	require.False(t, l.Post(add("refused")))
	ran := make(chan struct{})
	mb.exec(func() { close(ran) })
	testwait.Recv(t, ran, "the executor's own message after the loop closed")
	require.NotContains(t, got, "dropped")
	require.NotContains(t, got, "timer after CloseTimers")
}
