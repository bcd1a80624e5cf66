package activationrun

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// fakeEnv records every primitive called, in order. A primitive with an
// answer answers at once when answerNow is set; otherwise the test
// answers it.
type fakeEnv struct {
	t         *testing.T
	r         *Runner
	log       []string
	answerNow bool
	gone      bool
	inCall    bool
	armed     map[activation.Timer]Arming
	deadlines map[string]Deadline
	doneErr   []error
}

func newFake(t *testing.T, step func(activation.Event) []activation.Effect) *fakeEnv {
	f := &fakeEnv{t: t, armed: map[activation.Timer]Arming{}, deadlines: map[string]Deadline{}}
	f.r = New(func(ev activation.Event) []activation.Effect {
		if f.inCall {
			t.Fatalf("the machine is stepped with %s from inside a primitive", name(ev))
		}
		f.log = append(f.log, "step "+name(ev))
		return step(ev)
	}, f)
	return f
}

func name(v any) string {
	if v == nil {
		return "nil"
	}
	s := fmt.Sprintf("%T", v)
	if tf, ok := v.(activation.TimerFired); ok {
		s += "(" + tf.Timer.String() + ")"
	}
	return strings.TrimPrefix(s, "activation.")
}

func (f *fakeEnv) call(what string, d Deadline, ev activation.Event) {
	f.log = append(f.log, what)
	if d != 0 {
		f.deadlines[what] = d
	}
	if f.answerNow {
		f.inCall = true
		f.r.Answer(ev)
		f.inCall = false
	}
}

func (f *fakeEnv) note(what string) { f.log = append(f.log, what) }

func (f *fakeEnv) Gone() bool                                    { return f.gone }
func (f *fakeEnv) Stepped(activation.Event, []activation.Effect) {}
func (f *fakeEnv) Before(activation.Effect)                      {}
func (f *fakeEnv) Now() time.Time                                { return time.Unix(1, 0) }
func (f *fakeEnv) Lock(string)                                   { f.call("Lock", 0, activation.KeyLocked{}) }
func (f *fakeEnv) Unlock()                                       { f.note("Unlock") }
func (f *fakeEnv) ReadAuthority(_ string, d Deadline) {
	f.call("ReadAuthority", d, activation.AuthorityRead{})
}
func (f *fakeEnv) Watch(_ location.AuthorityKey, _ location.StoreVersion, d Deadline) {
	f.call("Watch", d, activation.Watched{})
}
func (f *fakeEnv) AdmitCapacity(d Deadline) {
	f.call("AdmitCapacity", d, activation.CapacityAdmitted{})
}
func (f *fakeEnv) ReleaseCapacity()             { f.note("ReleaseCapacity") }
func (f *fakeEnv) PutRoot(_ string, d Deadline) { f.call("PutRoot", d, activation.RootPut{}) }
func (f *fakeEnv) GetRoot(_ string, d Deadline) { f.call("GetRoot", d, activation.RootGot{}) }
func (f *fakeEnv) Reserve(_ activation.Reserve, d Deadline) {
	f.call("Reserve", d, activation.WriteAnswered{})
}
func (f *fakeEnv) CompareAndSet(e activation.CompareAndSet, d Deadline) {
	f.call(fmt.Sprintf("CompareAndSet(settle=%v)", e.Settle), d, activation.WriteAnswered{})
}
func (f *fakeEnv) ReadRecord(_ location.AuthorityKey, d Deadline) {
	f.call("ReadRecord", d, activation.RecordRead{})
}
func (f *fakeEnv) AbortReservation(_ activation.AbortReservation, d Deadline) {
	f.call("AbortReservation", d, activation.AbortAnswered{})
}
func (f *fakeEnv) Delete(_ activation.Delete, d Deadline) { f.call("Delete", d, activation.Deleted{}) }
func (f *fakeEnv) DeleteRoot(_ string, d Deadline)        { f.call("DeleteRoot", d, nil) }
func (f *fakeEnv) ReadOwner(_ *messages.Owner, d Deadline) {
	f.call("ReadOwner", d, activation.OwnerRead{})
}
func (f *fakeEnv) ClaimCheckpoint(_ activation.ClaimCheckpoint, d Deadline) {
	f.call("ClaimCheckpoint", d, activation.CheckpointClaimed{})
}
func (f *fakeEnv) Stage(_ activation.Stage, d Deadline) { f.call("Stage", d, activation.Staged{}) }
func (f *fakeEnv) DiscardStaged()                       { f.note("DiscardStaged") }
func (f *fakeEnv) Open(_ activation.Open, d Deadline)   { f.call("Open", d, activation.Opened{}) }
func (f *fakeEnv) PassOn(d Deadline)                    { f.call("PassOn", d, activation.PassedOn{}) }
func (f *fakeEnv) CloseLocal(_ activation.CloseLocal, d Deadline) {
	f.call("CloseLocal", d, activation.LocalClosed{})
}
func (f *fakeEnv) Forward(activation.Forward) { f.note("Forward") }
func (f *fakeEnv) RespondFailure(error)       { f.note("RespondFailure") }
func (f *fakeEnv) DropRoute(string)           { f.note("DropRoute") }
func (f *fakeEnv) Measure(activation.Measure) { f.note("Measure") }
func (f *fakeEnv) Log(l activation.Log)       { f.note("Log " + l.Event) }
func (f *fakeEnv) Arm(a Arming, _ time.Duration, _ time.Time) {
	f.armed[a.Timer] = a
	f.note("Arm " + a.Timer.String())
}
func (f *fakeEnv) Stop(t activation.Timer) { f.note("Stop " + t.String()) }
func (f *fakeEnv) Stalled()                { f.note("Stalled") }
func (f *fakeEnv) Done(err error) {
	f.doneErr = append(f.doneErr, err)
	f.note("Done")
}

// script is a machine that answers each event it is stepped with, by
// type name (with the timer for a fire), with the effects listed.
func script(steps map[string][]activation.Effect) func(activation.Event) []activation.Effect {
	return func(ev activation.Event) []activation.Effect { return steps[name(ev)] }
}

func (f *fakeEnv) want(t *testing.T, want ...string) {
	t.Helper()
	if !slices.Equal(f.log, want) {
		t.Fatalf("primitives and steps:\n got  %q\n want %q", f.log, want)
	}
}

var logEff = func(event string) activation.Log { return activation.Log{Event: event} }

// Each effect runs to its end before the next: one that waits for its
// answer holds back the effects after it.
func TestEffectsRunOneAtATime(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"AuthorityRead": {activation.Finish{}},
	}))
	f.r.Start([]activation.Effect{activation.ReadAuthority{}, logEff("after")})
	f.want(t, "ReadAuthority")
	f.r.Answer(activation.AuthorityRead{})
	f.want(t, "ReadAuthority", "Log after", "step AuthorityRead", "Done")
}

// An answer that comes from inside its primitive is queued: the effects
// after it run first, and the machine is never stepped from inside a
// primitive.
func TestAnswersAtOnceAreQueued(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"KeyLocked":     {activation.ReadAuthority{}},
		"AuthorityRead": {activation.Finish{}},
	}))
	f.answerNow = true
	f.r.Start([]activation.Effect{activation.LockKey{}, logEff("locked")})
	f.want(t, "Lock", "Log locked", "step KeyLocked", "ReadAuthority", "step AuthorityRead", "Unlock", "Done")
}

// A timer that fires while an answer is awaited waits its turn: the
// answer is stepped first.
func TestFireWaitsForTheAnswer(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"AuthorityRead":     {logEff("read")},
		"TimerFired(retry)": {activation.Finish{}},
	}))
	f.r.Start([]activation.Effect{activation.StartTimer{Timer: activation.TimerRetry}, activation.ReadAuthority{}})
	f.r.Fire(f.armed[activation.TimerRetry])
	f.want(t, "Arm retry", "ReadAuthority")
	f.r.Answer(activation.AuthorityRead{})
	f.want(t, "Arm retry", "ReadAuthority", "step AuthorityRead", "Log read", "step TimerFired(retry)", "Done")
}

// A runner waiting only for a timer steps its fire at once.
func TestIdleRunnerStepsAFire(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{"TimerFired(settle)": {activation.Finish{}}}))
	f.r.Start([]activation.Effect{activation.StartTimer{Timer: activation.TimerSettle}})
	if !f.r.Idle() || f.r.Done() {
		t.Fatalf("idle %v, done %v: want a runner waiting for its timer", f.r.Idle(), f.r.Done())
	}
	f.r.Fire(f.armed[activation.TimerSettle])
	f.want(t, "Arm settle", "step TimerFired(settle)", "Done")
}

// A fire of a stopped timer, or of an arming replaced since, never
// reaches the machine, nor one that fired and was stopped before its
// turn.
func TestStaleFiresAreDropped(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"AuthorityRead":      {activation.StopTimer{Timer: activation.TimerRetry}, activation.StartTimer{Timer: activation.TimerSettle}},
		"TimerFired(settle)": {activation.Finish{}},
	}))
	f.r.Start([]activation.Effect{
		activation.StartTimer{Timer: activation.TimerDeadline},
		activation.StartTimer{Timer: activation.TimerRetry},
		activation.ReadAuthority{},
	})
	first := f.armed[activation.TimerDeadline]
	f.r.Fire(f.armed[activation.TimerRetry]) // fired, then stopped before its turn
	f.r.Answer(activation.AuthorityRead{})
	settle := f.armed[activation.TimerSettle]
	f.r.Fire(first)
	f.want(t, "Arm deadline", "Arm retry", "ReadAuthority", "step AuthorityRead", "Stop retry", "Arm settle", "step TimerFired(deadline)")
	f.log = nil
	// A re-armed deadline: its first arming's fire does not count.
	f.r.exec(activation.StartTimer{Timer: activation.TimerDeadline})
	f.r.Fire(first)
	f.r.Fire(Arming{Timer: activation.TimerRetry, Seq: settle.Seq + 100})
	f.r.Fire(settle)
	f.want(t, "Arm deadline", "step TimerFired(settle)", "Stop deadline", "Done")
}

// Every effect of Finish's step runs; the answers still queued are not
// stepped; the timers stop and what the machine held is given back before
// the host learns the outcome, once.
func TestFinishGivesBackWhatWasHeld(t *testing.T) {
	errEnd := errors.New("end")
	f := newFake(t, script(map[string][]activation.Effect{
		"KeyLocked":        {activation.AdmitCapacity{}},
		"CapacityAdmitted": {activation.StartTimer{Timer: activation.TimerRetry}, activation.Finish{Err: errEnd}, logEff("last"), activation.ReadAuthority{}},
	}))
	f.answerNow = true
	f.r.Start([]activation.Effect{activation.StartTimer{Timer: activation.TimerDeadline}, activation.LockKey{}})
	f.want(t, "Arm deadline", "Lock", "step KeyLocked", "AdmitCapacity", "step CapacityAdmitted", "Arm retry", "Log last", "ReadAuthority",
		"Stop deadline", "Stop retry", "ReleaseCapacity", "Unlock", "Done")
	if len(f.doneErr) != 1 || f.doneErr[0] != errEnd || f.r.Err() != errEnd || !f.r.Done() {
		t.Fatalf("done with %v (err %v): want once with the Finish's error", f.doneErr, f.r.Err())
	}
	f.r.Fire(f.armed[activation.TimerRetry])
	f.r.Answer(activation.AuthorityRead{})
	if len(f.doneErr) != 1 {
		t.Fatalf("Done %d times", len(f.doneErr))
	}
}

// What the machine gave back itself is not given back again; an Unlock
// or a ReleaseCapacity of nothing held does nothing.
func TestGivenBackOnce(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"KeyLocked":        {activation.AdmitCapacity{}},
		"CapacityAdmitted": {activation.ReleaseCapacity{}, activation.UnlockKey{}, activation.UnlockKey{}, activation.ReleaseCapacity{}, activation.Finish{}},
	}))
	f.answerNow = true
	f.r.Start([]activation.Effect{activation.UnlockKey{}, activation.LockKey{}})
	f.want(t, "Lock", "step KeyLocked", "AdmitCapacity", "step CapacityAdmitted", "ReleaseCapacity", "Unlock", "Done")
}

// A capacity refused holds nothing to give back.
func TestRefusedCapacityIsNotReleased(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{
		"CapacityAdmitted": {activation.Finish{}},
	}))
	f.r.Start([]activation.Effect{activation.AdmitCapacity{}})
	f.r.Answer(activation.CapacityAdmitted{Err: roamerr.ErrCapacityExceeded})
	f.want(t, "AdmitCapacity", "step CapacityAdmitted", "Done")
}

// A machine that waits for neither an answer nor a timer ends, loudly.
func TestStalledMachineEnds(t *testing.T) {
	f := newFake(t, script(nil))
	f.r.Start([]activation.Effect{logEff("nothing")})
	f.want(t, "Log nothing", "Stalled", "Done")
	if !errors.Is(f.r.Err(), roamerr.ErrUnavailable) {
		t.Fatalf("err %v: want ErrUnavailable", f.r.Err())
	}
}

// A host that is gone runs nothing more, and gives nothing back.
func TestGoneHostRunsNothing(t *testing.T) {
	f := newFake(t, script(map[string][]activation.Effect{"AuthorityRead": {logEff("after")}}))
	f.r.Start([]activation.Effect{activation.StartTimer{Timer: activation.TimerDeadline}, activation.ReadAuthority{}})
	f.gone = true
	f.r.Answer(activation.AuthorityRead{})
	f.r.Fire(f.armed[activation.TimerDeadline])
	f.want(t, "Arm deadline", "ReadAuthority")
}

// Calls that settle or undo an outcome run under a timeout of their own;
// every other call under the operation's deadline.
func TestDeadlines(t *testing.T) {
	effects := []activation.Effect{
		activation.ReadAuthority{}, activation.Watch{}, activation.AdmitCapacity{}, activation.PutRoot{}, activation.GetRoot{},
		activation.Reserve{}, activation.CompareAndSet{}, activation.CompareAndSet{Settle: true}, activation.ReadRecord{},
		activation.AbortReservation{}, activation.Delete{}, activation.DeleteRoot{}, activation.ReadOwner{},
		activation.ClaimCheckpoint{}, activation.Stage{}, activation.Open{}, activation.PassOn{}, activation.CloseLocal{},
		activation.Finish{},
	}
	f := newFake(t, func(activation.Event) []activation.Effect { return nil })
	f.answerNow = true
	f.r.Start(effects)
	want := map[string]Deadline{
		"CompareAndSet(settle=true)": OwnTimeout, "AbortReservation": OwnTimeout, "DeleteRoot": OwnTimeout,
	}
	for what, d := range f.deadlines {
		w := want[what]
		if w == 0 {
			w = OperationDeadline
		}
		if d != w {
			t.Errorf("%s runs under %v, want %v", what, d, w)
		}
	}
	if len(f.deadlines) != 18 {
		t.Fatalf("%d calls with a deadline, want 18: %q", len(f.deadlines), f.log)
	}
	f2 := newFake(t, func(activation.Event) []activation.Effect { return nil })
	f2.answerNow = true
	f2.r.Start([]activation.Effect{activation.ReadRecord{Settle: true}, activation.Finish{}})
	if d := f2.deadlines["ReadRecord"]; d != OwnTimeout {
		t.Fatalf("a settling read runs under %v, want its own timeout", d)
	}
}
