package relocation

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/timersched"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/messages"
)

// A timer whose tick has fired but not yet been handled when the actor is
// captured keeps its chain on the target: that tick, handled there, arms
// the next slot.
// Reference: docs/PROTOCOL.md §5.5 (timers that move).
func TestTimerWithATickInFlightKeepsTicking(t *testing.T) {
	sys := actor.NewActorSystem()
	ticks := make(chan *messages.TimerTick, 16)
	self := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if tk, ok := c.Message().(*messages.TimerTick); ok {
			ticks <- tk
		}
	}))
	src := &timers{sys: sys, self: self, regs: map[string]*timerReg{}, clock: machine.Real}
	require.NoError(t, src.register(&timerReg{Reg: timersched.Reg{Name: "beat", Period: 5 * time.Millisecond}}, time.Now(), nil))
	first := <-ticks // fired, not handled: in flight
	regs := src.capture()
	require.Len(t, regs, 1)
	require.Zero(t, regs[0].NextScheduleUnixMillis, "in flight: no cursor")

	dst := &timers{sys: sys, self: self, regs: map[string]*timerReg{}, clock: machine.Real}
	dst.restore(regs)
	require.True(t, dst.onTick(first), "the in-flight tick is live on the target")
	require.EqualValues(t, 1, first.GetDeliveryIndex())
	select {
	case next := <-ticks:
		require.True(t, dst.onTick(next))
		require.EqualValues(t, 2, next.GetDeliveryIndex())
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the chain stopped after the move")
	}
	dst.stopAll()
}

// A paused timer resumes at its armed slot after a failed move.
// Reference: PROTOCOL.md §6.2 (an explicit failure restores the source).
func TestPausedTimerResumes(t *testing.T) {
	sys := actor.NewActorSystem()
	ticks := make(chan *messages.TimerTick, 16)
	self := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if tk, ok := c.Message().(*messages.TimerTick); ok {
			ticks <- tk
		}
	}))
	clock := machine.NewManual()
	tm := &timers{sys: sys, self: self, regs: map[string]*timerReg{}, clock: clock}
	require.NoError(t, tm.register(&timerReg{Reg: timersched.Reg{Name: "later", Period: 5 * time.Millisecond}}, clock.Now().Add(time.Hour), nil))
	regs := tm.capture()
	require.NotZero(t, regs[0].NextScheduleUnixMillis, "armed, not fired: paused with its cursor")
	tm.resume()
	clock.Advance(time.Hour)
	select {
	case tk := <-ticks:
		require.True(t, tm.onTick(tk))
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the paused timer never resumed")
	}
	tm.stopAll()
}
