package machine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
)

// Timers fire in due order, arming order among equals, and only when the
// clock is advanced past them; a timer armed by a firing one fires within
// the same advance if due.
func TestManualFiresInDueOrder(t *testing.T) {
	c := machine.NewManual()
	start := c.Now()
	var got []string
	at := map[string]time.Duration{}
	arm := func(name string, d time.Duration) {
		c.AfterFunc(d, func() { got = append(got, name); at[name] = c.Now().Sub(start) })
	}
	arm("b", 2*time.Second)
	arm("a", time.Second)
	arm("b2", 2*time.Second)
	c.AfterFunc(1500*time.Millisecond, func() { arm("chained", 100*time.Millisecond) })
	require.Equal(t, 0, c.Advance(999*time.Millisecond))
	require.Empty(t, got)
	require.Equal(t, 5, c.Advance(1001*time.Millisecond))
	require.Equal(t, []string{"a", "chained", "b", "b2"}, got)
	require.Equal(t, 1600*time.Millisecond, at["chained"], "a timer runs at its own due time")
	require.Equal(t, 2*time.Second, c.Now().Sub(start))
	require.Zero(t, c.Armed())
}

// A stopped timer never runs, and Stop says whether it stopped one.
func TestManualStop(t *testing.T) {
	c := machine.NewManual()
	ran := false
	tm := c.AfterFunc(time.Second, func() { ran = true })
	require.True(t, tm.Stop())
	require.False(t, tm.Stop())
	c.Advance(time.Hour)
	require.False(t, ran)
	tm = c.AfterFunc(0, func() { ran = true })
	require.True(t, c.AdvanceToNext())
	require.True(t, ran)
	require.False(t, tm.Stop(), "fired already")
	require.False(t, c.AdvanceToNext())
}

// A re-armed, cancelled or closed named timer does not run, even when its
// clock fired the old arming; the newest arming does.
func TestTimersKeepOnlyTheNewestArming(t *testing.T) {
	c := machine.NewManual()
	s := machine.NewTimers[string](c)
	var got []string
	s.Arm("x", time.Second, func() { got = append(got, "x1") })
	s.Arm("x", 2*time.Second, func() { got = append(got, "x2") })
	s.Arm("y", time.Second, func() { got = append(got, "y") })
	require.True(t, s.Cancel("y"))
	require.False(t, s.Cancel("y"))
	require.Equal(t, 1, s.Len())
	c.Advance(3 * time.Second)
	require.Equal(t, []string{"x2"}, got)
	require.False(t, s.Armed("x"), "a fired timer is no longer armed")

	s.Arm("z", time.Second, func() { got = append(got, "z") })
	s.Close()
	s.Arm("w", time.Second, func() { got = append(got, "w") })
	c.Advance(time.Hour)
	require.Equal(t, []string{"x2"}, got, "closed: nothing armed before or after runs")
	require.Zero(t, s.Len())
}

// A fired arming that lost a race with Cancel does not run: the real
// clock's AfterFunc may already be on its way when Cancel is called.
func TestTimersCancelWinsOverAFiredArming(t *testing.T) {
	c := &heldClock{Manual: machine.NewManual()}
	s := machine.NewTimers[int](c)
	ran := false
	s.Arm(1, time.Second, func() { ran = true })
	fire := c.take() // the clock fired; the function has not started
	s.Cancel(1)
	fire()
	require.False(t, ran)
}

// A posted firing is stepped only while it is the timer's current arming:
// one cancelled, re-armed or closed after it fired but before its machine
// took it from the mailbox is dropped, and Take disarms, so a firing is
// taken at most once.
func TestTimersPostedFiringIsTakenOnlyWhileCurrent(t *testing.T) {
	c := machine.NewManual()
	s := machine.NewTimers[string](c)
	var mailbox []machine.Fired[string]
	post := func(f machine.Fired[string]) { mailbox = append(mailbox, f) }

	s.Post("a", time.Second, post)
	s.Post("b", time.Second, post)
	s.Post("c", time.Second, post)
	s.Post("d", time.Second, post)
	c.Advance(time.Second)
	require.Len(t, mailbox, 4)
	require.Equal(t, 4, s.Len(), "a posted firing stays armed until its machine takes it")

	s.Cancel("b")                  // cancelled after it fired
	s.Post("c", time.Minute, post) // re-armed after it fired
	s.CancelIf(func(k string) bool { return k == "d" })
	took := map[string]bool{}
	for _, f := range mailbox {
		took[f.Key] = s.Take(f)
	}
	require.Equal(t, map[string]bool{"a": true, "b": false, "c": false, "d": false}, took)
	require.False(t, s.Take(mailbox[0]), "a firing is taken once")
	require.True(t, s.Armed("c"))

	mailbox = nil
	c.Advance(time.Minute)
	require.Len(t, mailbox, 1)
	s.Close()
	require.False(t, s.Take(mailbox[0]), "closing drops a firing not taken yet")
	s.Post("e", 0, post)
	c.Advance(time.Second)
	require.Len(t, mailbox, 1, "a closed set arms nothing")
}

// heldClock records AfterFunc functions instead of arming them.
type heldClock struct {
	*machine.Manual
	held []func()
}

func (c *heldClock) AfterFunc(_ time.Duration, f func()) machine.Timer {
	c.held = append(c.held, f)
	return c.Manual.AfterFunc(time.Hour, func() {})
}

func (c *heldClock) take() func() {
	f := c.held[0]
	c.held = c.held[1:]
	return f
}

// A Manual deadline ends the context when the clock passes it, as
// DeadlineExceeded; cancelling first says Canceled.
func TestWithTimeoutOnManual(t *testing.T) {
	c := machine.NewManual()
	ctx, cancel := machine.WithTimeout(context.Background(), c, time.Second)
	defer cancel()
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	require.Equal(t, c.Now().Add(time.Second), dl)
	require.NoError(t, ctx.Err())
	c.Advance(time.Second)
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)

	ctx2, cancel2 := machine.WithTimeout(context.Background(), c, time.Second)
	cancel2()
	require.ErrorIs(t, ctx2.Err(), context.Canceled)
	require.Zero(t, c.Armed(), "cancel stops the deadline's timer")
}

// Sleep returns when the clock passes d, or with the context's error.
func TestSleep(t *testing.T) {
	c := machine.NewManual()
	done := make(chan error, 1)
	go func() { done <- machine.Sleep(context.Background(), c, time.Minute) }()
	testwait.For(t, func() bool { return c.Armed() > 0 }, "the sleeper arming its timer")
	c.Advance(time.Minute)
	require.NoError(t, <-done)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := machine.Sleep(ctx, c, time.Minute)
	require.True(t, errors.Is(err, context.Canceled))
	require.Zero(t, c.Armed())
}

// Time never goes back: a timer's function that advances the clock
// further is not undone when the outer Advance ends.
func TestManualNeverGoesBack(t *testing.T) {
	c := machine.NewManual()
	start := c.Now()
	c.AfterFunc(0, func() { c.Advance(time.Hour) })
	c.Advance(time.Second)
	require.Equal(t, time.Hour, c.Now().Sub(start))
}

// A past deadline ends the context at once, and a parent's earlier
// deadline is the context's, as with context.WithTimeout.
func TestWithTimeoutPastAndParentDeadlines(t *testing.T) {
	c := machine.NewManual()
	ctx, cancel := machine.WithTimeout(context.Background(), c, 0)
	defer cancel()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)

	parent, cancelParent := machine.WithTimeout(context.Background(), c, time.Second)
	defer cancelParent()
	child, cancelChild := machine.WithTimeout(parent, c, time.Hour)
	defer cancelChild()
	dl, _ := child.Deadline()
	require.Equal(t, c.Now().Add(time.Second), dl)
}

// A deadline on a Manual clock takes its parent's only when the parent's
// is on a Manual clock too: a real-time deadline is another time line.
func TestWithDeadlineTakesOnlyAManualParentsDeadline(t *testing.T) {
	c := machine.NewManualAt(time.Now().Add(24 * time.Hour)) // ahead of the real time, as a test advances it
	parent, cancelParent := machine.WithTimeout(context.Background(), c, time.Second)
	defer cancelParent()
	ctx, cancel := context.WithCancel(parent) // a derived context hides the type
	defer cancel()
	child, cancelChild := machine.WithDeadline(ctx, c, c.Now().Add(time.Minute))
	defer cancelChild()
	dl, _ := child.Deadline()
	require.Equal(t, c.Now().Add(time.Second), dl, "the Manual parent's deadline comes first")
	realParent, cancelReal := context.WithTimeout(context.Background(), time.Hour)
	defer cancelReal()
	other, cancelOther := machine.WithTimeout(realParent, c, time.Minute)
	defer cancelOther()
	dl, _ = other.Deadline()
	require.Equal(t, c.Now().Add(time.Minute), dl, "a real-time parent's deadline is not on this clock")
	c.Advance(time.Second)
	require.Error(t, child.Err(), "the child outlived its parent's deadline")
	require.NoError(t, other.Err())
	c.Advance(time.Minute)
	require.ErrorIs(t, other.Err(), context.DeadlineExceeded)
}

// A set's timers fire in due order (arming order among equals), each at
// its own due time, however they were armed, re-armed and cancelled; the
// set keeps one clock timer, for the earliest.
func TestTimersFireInDueOrder(t *testing.T) {
	c := machine.NewManual()
	s := machine.NewTimers[int](c)
	start := c.Now()
	var got []int
	at := map[int]time.Duration{}
	arm := func(k int, d time.Duration) {
		s.Arm(k, d, func() { got = append(got, k); at[k] = c.Now().Sub(start) })
	}
	for k, d := range []time.Duration{5, 3, 9, 3, 7, 1, 8, 2, 6, 4} {
		arm(k, d*time.Second)
	}
	require.Equal(t, 1, c.Armed(), "one clock timer for the set")
	require.True(t, s.Cancel(4)) // 7 s
	arm(2, 10*time.Second)       // re-armed later: 9 s → 10 s
	arm(6, 500*time.Millisecond) // re-armed earlier: 8 s → 0.5 s
	c.Advance(time.Hour)
	require.Equal(t, []int{6, 5, 7, 1, 3, 9, 0, 8, 2}, got)
	require.Equal(t, 500*time.Millisecond, at[6])
	require.Equal(t, 3*time.Second, at[1])
	require.Equal(t, 10*time.Second, at[2])
	require.Zero(t, s.Len())
	require.Zero(t, c.Armed(), "no clock timer left once nothing is armed")
}

// Arming and cancelling a timer, behind an earlier one, allocates nothing:
// a driver arms several timeouts per operation and cancels nearly all.
func TestTimersArmingAllocatesNothing(t *testing.T) {
	l := machine.NewLoop[[4]uint64](machine.NewManual())
	l.OnTimer(func([4]uint64) {})
	l.ArmEvent([4]uint64{0}, time.Second) // the earliest, armed once
	k := [4]uint64{1, 2, 3, 4}
	allocs := testing.AllocsPerRun(1000, func() {
		l.ArmEvent(k, time.Minute)
		l.ArmEvent(k, 2*time.Minute)
		l.Cancel(k)
	})
	require.Zero(t, allocs)
}
