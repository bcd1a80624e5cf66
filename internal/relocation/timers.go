package relocation

import (
	"fmt"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/timersched"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Overrun says what a periodic timer does when its ticks fall behind.
type Overrun = timersched.Overrun

const (
	// OverrunSkip drops the missed slots and counts them (the default).
	OverrunSkip = timersched.Skip
	// OverrunCatchUp delivers missed slots at once, up to a limit.
	OverrunCatchUp = timersched.CatchUp
)

// TimerOption configures Every.
type TimerOption func(*timerReg)

// CatchUp makes a periodic timer deliver up to limit missed slots at once.
func CatchUp(limit uint32) TimerOption {
	return func(r *timerReg) { r.Overrun, r.CatchUpLimit = OverrunCatchUp, limit }
}

// TimerSet is the framework timers of one relocatable actor. Use it only
// from the actor's own Receive: it is not safe for other goroutines.
type TimerSet struct{ t *timers }

// Timers returns the timers of the relocatable actor whose context c is.
// A timer delivers *messages.TimerTick carrying its name, and moves with
// the actor: registrations, schedule cursors and pending ticks are captured
// and restored by the framework, so the application never re-registers
// them (docs/PROTOCOL.md §5.5: timer registrations and pending ticks).
func Timers(c actor.Context) (TimerSet, error) {
	obj, ok := c.Get(hostExtensionID).(*object)
	if !ok {
		return TimerSet{}, fmt.Errorf("%w: %T is not a relocatable actor", roamerr.ErrInvalidOperation, c.Actor())
	}
	t := obj.timers()
	t.sys, t.self = c.ActorSystem(), c.Self()
	return TimerSet{t: t}, nil
}

// Every delivers a TimerTick named name every period, from now.
func (s TimerSet) Every(name string, period time.Duration, opts ...TimerOption) error {
	if err := timersched.Valid(name, true, period); err != nil {
		return err
	}
	return s.t.register(&timerReg{Reg: timersched.Reg{Name: name, Period: period}}, s.t.clock.Now().Add(period), opts)
}

// After delivers one TimerTick named name after delay.
func (s TimerSet) After(name string, delay time.Duration) error {
	if err := timersched.Valid(name, false, 0); err != nil {
		return err
	}
	return s.t.register(&timerReg{Reg: timersched.Reg{Name: name}}, s.t.clock.Now().Add(max(delay, 0)), nil)
}

// Cancel removes a timer; a tick already on its way is not delivered.
func (s TimerSet) Cancel(name string) {
	if r := s.t.regs[name]; r != nil {
		r.stop()
		delete(s.t.regs, name)
	}
}

// Names lists the registered timers.
func (s TimerSet) Names() []string {
	out := make([]string, 0, len(s.t.regs))
	for n := range s.t.regs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// timers belongs to one incarnation. Every method runs on the object's
// goroutine (turns, the seal capture, restore and Unseal Do items); the
// AfterFunc callbacks only post a tick fixed when the timer was armed.
type timers struct {
	sys   *actor.ActorSystem
	self  *actor.PID
	regs  map[string]*timerReg
	clock machine.Clock
}

// timerReg is one registration: its schedule (timersched.Reg) and the
// clock timer of its armed tick.
type timerReg struct {
	timersched.Reg
	handle machine.Timer // the armed tick's timer; nil once it is handled
}

// dueWithin reports a timer whose armed tick is due before now+window
// (or overdue), by name; the object's goroutine only.
func (t *timers) dueWithin(now time.Time, window time.Duration) (string, bool) {
	for name, r := range t.regs {
		if r.Due(r.handle != nil, now, window) {
			return name, true
		}
	}
	return "", false
}

func (o *object) timers() *timers {
	if o.tm == nil {
		o.tm = &timers{regs: map[string]*timerReg{}, clock: o.d.clock}
	}
	return o.tm
}

// register starts r, whose name and period timersched.Valid accepted,
// in place of a registration of the same name.
func (t *timers) register(r *timerReg, first time.Time, opts []TimerOption) error {
	for _, o := range opts {
		o(r)
	}
	if old := t.regs[r.Name]; old != nil {
		old.stop()
	}
	t.regs[r.Name] = r
	t.arm(r, r.Start(first))
	return nil
}

// arm posts tick, the schedule's armed slot, at its time.
func (t *timers) arm(r *timerReg, tick *messages.TimerTick) {
	sys, self := t.sys, t.self
	r.handle = t.clock.AfterFunc(max(machine.Until(t.clock, r.ArmedAt()), 0), func() { sys.Root.Send(self, tick) })
}

// stop cancels the armed slot; it reports false if the tick already fired.
func (r *timerReg) stop() bool {
	if r.handle == nil {
		return false
	}
	stopped := r.handle.Stop()
	r.handle = nil
	return stopped
}

// onTick handles a TimerTick before the application sees it
// (timersched.Reg.Tick): it reports whether the tick is live, and posts
// and arms what its schedule says.
func (t *timers) onTick(tick *messages.TimerTick) bool {
	r := t.regs[tick.GetName()]
	if r == nil {
		return false // cancelled while on its way
	}
	h := r.Tick(tick, t.clock.Now())
	if h.Done {
		delete(t.regs, r.Name)
	}
	if h.Next != nil {
		r.handle = nil
		for _, c := range h.CatchUp {
			t.sys.Root.Send(t.self, c)
		}
		t.arm(r, h.Next)
	}
	return h.Live
}

// capture stops every timer and describes it for the payload.
func (t *timers) capture() []envelope.TimerRegistration {
	out := make([]envelope.TimerRegistration, 0, len(t.regs))
	for _, r := range t.regs {
		out = append(out, r.Capture(r.stop()))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// stopAll cancels every armed slot (the incarnation is removed).
func (t *timers) stopAll() {
	for _, r := range t.regs {
		r.stop()
	}
}

// resume re-arms what capture paused: the move failed before relay-ready
// and the source runs on (PROTOCOL.md §6.2).
func (t *timers) resume() {
	for _, r := range t.regs {
		if tick := r.Resume(); tick != nil {
			t.arm(r, tick)
		}
	}
}

// restore rebuilds the registrations of a payload and arms those whose
// tick was not on its way.
func (t *timers) restore(regs []envelope.TimerRegistration) {
	for _, e := range regs {
		reg, tick := timersched.Restore(e)
		r := &timerReg{Reg: *reg}
		if old := t.regs[r.Name]; old != nil {
			old.stop() // registered again by the new instance's Started
		}
		t.regs[r.Name] = r
		if tick != nil {
			t.arm(r, tick)
		}
	}
}

// pendingTick turns a queued TimerTick into its payload form.
func pendingTick(order uint64, tick *messages.TimerTick) envelope.PendingTimerTick {
	return envelope.PendingTimerTick{
		ParticipantID: 1, Order: order, Name: tick.GetName(), DeliveryIndex: tick.GetDeliveryIndex(),
		ScheduledIndex: tick.GetScheduleIndex(), ScheduledUnixMillis: uint64(tick.GetScheduledUnixMillis()), SkippedTicks: tick.GetSkipped(),
	}
}

func tickOf(p envelope.PendingTimerTick) *messages.TimerTick {
	return &messages.TimerTick{Name: p.Name, DeliveryIndex: p.DeliveryIndex, ScheduleIndex: p.ScheduledIndex,
		ScheduledUnixMillis: int64(p.ScheduledUnixMillis), Skipped: p.SkippedTicks}
}
