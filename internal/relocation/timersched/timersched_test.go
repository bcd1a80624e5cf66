package timersched

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var t0 = time.UnixMilli(1_000_000)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// A timer needs a valid name; a periodic one a positive period.
func TestValid(t *testing.T) {
	require.NoError(t, Valid("beat", true, ms(5)))
	require.NoError(t, Valid("once", false, 0))
	require.ErrorIs(t, Valid("beat", true, 0), roamerr.ErrInvalidOperation)
	require.ErrorIs(t, Valid("beat", true, -ms(1)), roamerr.ErrInvalidOperation)
	require.ErrorIs(t, Valid("", false, 0), roamerr.ErrInvalidOperation)
}

// Each handled tick of a periodic timer on time arms the next slot one
// period later, numbered in order; a late one misses the slots whose time
// passed: skipped and counted, or caught up to the limit first.
// Reference: PROTOCOL.md §5.5
func TestTick(t *testing.T) {
	for _, c := range []struct {
		name    string
		reg     Reg
		now     time.Time // when the first tick is handled
		catchUp []uint64  // schedule indexes delivered at once
		next    uint64    // the armed slot's index
		nextAt  time.Time
		skipped uint32
	}{
		{"on time", Reg{Name: "b", Period: ms(10)}, t0.Add(ms(10)), nil, 2, t0.Add(ms(20)), 0},
		{"late within the period", Reg{Name: "b", Period: ms(10)}, t0.Add(ms(19)), nil, 2, t0.Add(ms(20)), 0},
		{"three slots missed, skipped", Reg{Name: "b", Period: ms(10)}, t0.Add(ms(45)), nil, 5, t0.Add(ms(50)), 3},
		{"three missed, two caught up", Reg{Name: "b", Period: ms(10), Overrun: CatchUp, CatchUpLimit: 2}, t0.Add(ms(45)),
			[]uint64{2, 3}, 5, t0.Add(ms(50)), 1},
		{"three missed, all caught up", Reg{Name: "b", Period: ms(10), Overrun: CatchUp, CatchUpLimit: 9}, t0.Add(ms(45)),
			[]uint64{2, 3, 4}, 5, t0.Add(ms(50)), 0},
	} {
		r := c.reg
		first := r.Start(t0.Add(ms(10)))
		require.EqualValues(t, 1, first.GetScheduleIndex(), c.name)
		h := r.Tick(first, c.now)
		require.True(t, h.Live, c.name)
		require.False(t, h.Done, c.name)
		require.EqualValues(t, 1, first.GetDeliveryIndex(), c.name)
		var got []uint64
		for _, tk := range h.CatchUp {
			got = append(got, tk.GetScheduleIndex())
		}
		require.Equal(t, c.catchUp, got, c.name)
		require.NotNil(t, h.Next, c.name)
		require.Equal(t, c.next, h.Next.GetScheduleIndex(), c.name)
		require.Equal(t, c.nextAt.UnixMilli(), h.Next.GetScheduledUnixMillis(), c.name)
		require.Equal(t, c.nextAt, r.ArmedAt(), c.name)
		require.Equal(t, c.skipped, h.Next.GetSkipped(), c.name)

		// Caught-up ticks are live and arm nothing: the schedule is armed.
		for i, tk := range h.CatchUp {
			ch := r.Tick(tk, c.now)
			require.True(t, ch.Live, c.name)
			require.Nil(t, ch.Next, c.name)
			require.EqualValues(t, 2+i, tk.GetDeliveryIndex(), "%s: delivered in order", c.name)
		}
		nh := r.Tick(h.Next, c.nextAt)
		require.True(t, nh.Live, c.name)
		require.Equal(t, c.skipped, h.Next.GetSkipped(), "%s: the count goes with each tick", c.name)
		require.EqualValues(t, 2+len(c.catchUp), h.Next.GetDeliveryIndex(), c.name)
	}
}

// A tick of a slot already completed (cancelled or registered again
// while on its way, or a duplicate) is not live; a one-shot timer's tick
// ends it.
func TestTickNotLive(t *testing.T) {
	r := Reg{Name: "b", Period: ms(10)}
	first := r.Start(t0)
	require.True(t, r.Tick(first, t0).Live)
	dup := &messages.TimerTick{Name: "b", ScheduleIndex: 1}
	require.Equal(t, Handled{}, r.Tick(dup, t0))

	once := Reg{Name: "o"}
	h := once.Tick(once.Start(t0), t0)
	require.Equal(t, Handled{Live: true, Done: true}, h)
}

// An armed tick not due within the window, or a paused one, is not due.
func TestDue(t *testing.T) {
	r := Reg{Name: "b", Period: ms(10)}
	r.Start(t0.Add(ms(10)))
	require.True(t, r.Due(true, t0, ms(11)))
	require.False(t, r.Due(true, t0, ms(10)))
	require.False(t, r.Due(false, t0, ms(11)), "its tick fired already")
	r.Capture(true)
	require.False(t, r.Due(true, t0, ms(11)), "paused")
}

// A capture of an armed timer carries its cursor and pauses it; the
// target arms that slot, next in order. A timer whose tick was on its way
// has no cursor: the tick re-arms it where it is handled. A failed move
// resumes a paused timer at its slot.
// Reference: PROTOCOL.md §5.5, §6.2
func TestCaptureRestoreResume(t *testing.T) {
	r := Reg{Name: "b", Period: ms(10), Overrun: CatchUp, CatchUpLimit: 3}
	r.Tick(r.Start(t0.Add(ms(10))), t0.Add(ms(10))) // slot 2 armed at t0+20ms
	e := r.Capture(true)
	require.Equal(t, "b", e.Name)
	require.EqualValues(t, 10, e.PeriodMillis)
	require.EqualValues(t, CatchUp, e.OverrunPolicy)
	require.EqualValues(t, 3, e.CatchUpLimit)
	require.EqualValues(t, 1, e.CompletedDeliveryIndex)
	require.EqualValues(t, 1, e.CompletedScheduleIndex)
	require.EqualValues(t, t0.Add(ms(20)).UnixMilli(), e.NextScheduleUnixMillis)

	restored, tick := Restore(e)
	require.NotNil(t, tick)
	require.EqualValues(t, 2, tick.GetScheduleIndex())
	require.Equal(t, t0.Add(ms(20)), restored.ArmedAt())
	h := restored.Tick(tick, t0.Add(ms(20)))
	require.True(t, h.Live)
	require.EqualValues(t, 2, tick.GetDeliveryIndex(), "delivery indexes go on across the move")
	require.EqualValues(t, 3, h.Next.GetScheduleIndex())

	again := r.Resume()
	require.NotNil(t, again, "a paused timer resumes")
	require.EqualValues(t, 2, again.GetScheduleIndex())
	require.Nil(t, r.Resume(), "once")

	// Fired, not handled: no cursor, and the in-flight tick is live on
	// the target and arms the next slot.
	f := Reg{Name: "f", Period: ms(10)}
	inFlight := f.Start(t0.Add(ms(10)))
	e = f.Capture(false)
	require.Zero(t, e.NextScheduleUnixMillis)
	require.Zero(t, e.CompletedScheduleIndex)
	fr, tick := Restore(e)
	require.Nil(t, tick)
	h = fr.Tick(inFlight, t0.Add(ms(10)))
	require.True(t, h.Live)
	require.NotNil(t, h.Next)
	require.EqualValues(t, 2, h.Next.GetScheduleIndex())
	require.Nil(t, f.Resume(), "not paused")
}

// Skipped slots are completed: a capture after a skip names the slot
// before the armed one, so the target arms the same slot.
func TestCaptureAfterSkip(t *testing.T) {
	r := Reg{Name: "b", Period: ms(10)}
	h := r.Tick(r.Start(t0.Add(ms(10))), t0.Add(ms(45)))
	require.EqualValues(t, 5, h.Next.GetScheduleIndex())
	e := r.Capture(true)
	require.EqualValues(t, 4, e.CompletedScheduleIndex)
	_, tick := Restore(e)
	require.EqualValues(t, 5, tick.GetScheduleIndex())
}
