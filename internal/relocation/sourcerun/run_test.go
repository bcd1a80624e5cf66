package sourcerun

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
)

var testID = handoff.Identity{RelocationID: 7, TargetAttemptGeneration: 1, Fence: handoff.Fence{NodeRid: "src", NodeGeneration: 1, OwnerGeneration: 3}}

type mode int

const (
	open mode = iota
	sealed
	redirecting
)

// fakeEnv is one participant's primitives: a mailbox with the modes of
// mailbox.Mailbox, and a log of what went out, in order. Messages are
// strings; those starting with "req" expect a reply.
type fakeEnv struct {
	run   *Run[string, string]
	mode  mode
	queue []string
	sink  func(string)
	out   []string // sends, refusals and follows, in order
	calls []string // everything else of note
	// owner is the participant's Session owner ("": not bound); gone: the
	// owners the mesh says are no members.
	owner string
	gone  map[string]bool
}

func newRun(t *testing.T) (*Run[string, string], *fakeEnv) {
	t.Helper()
	env := &fakeEnv{}
	env.run = New[string, string](handoff.NewSource(testID, handoff.DefaultConfig(), time.Unix(100, 0)), env, []*Part[string]{{}})
	return env.run, env
}

// post is a message arriving at the participant's mailbox.
func (f *fakeEnv) post(msgs ...string) {
	for _, m := range msgs {
		if f.mode == redirecting {
			f.sink(m)
			continue
		}
		f.queue = append(f.queue, m)
	}
}

// sealNow is the seal taking effect between turns: the queue so far is
// the saved work.
func (f *fakeEnv) sealNow() {
	saved := f.queue
	f.queue, f.mode = nil, sealed
	f.run.Captured(0, saved, nil)
}

func (f *fakeEnv) Gone() bool                              { return false }
func (f *fakeEnv) Stepped(handoff.Event, []handoff.Effect) {}
func (f *fakeEnv) Before(handoff.Effect)                   {}
func (f *fakeEnv) Seal(int) error                          { f.calls = append(f.calls, "seal"); return nil }

func (f *fakeEnv) Unseal(_ int, front []string) error {
	if f.mode != sealed {
		return errors.New("unseal: not sealed")
	}
	f.queue, f.mode = append(append([]string(nil), front...), f.queue...), open
	return nil
}

func (f *fakeEnv) Reopen(_ int, front func() []string) error {
	if f.mode != redirecting {
		return errors.New("reopen: not redirecting")
	}
	f.queue, f.mode, f.sink = append(front(), f.queue...), open, nil
	return nil
}

func (f *fakeEnv) Redirect(_ int, sink func(string)) error {
	switch f.mode {
	case sealed:
		held := f.queue
		f.queue, f.mode, f.sink = nil, redirecting, sink
		for _, m := range held {
			sink(m)
		}
	case redirecting:
		f.sink = sink
	default:
		return errors.New("redirect: open")
	}
	return nil
}

func (f *fakeEnv) Leaving(int)         {}
func (f *fakeEnv) Serving(int)         { f.calls = append(f.calls, "serving") }
func (f *fakeEnv) Unsealed(int)        { f.calls = append(f.calls, "unsealed") }
func (f *fakeEnv) Following(int)       {}
func (f *fakeEnv) Unregister(int)      { f.calls = append(f.calls, "unregister") }
func (f *fakeEnv) Conflict(int) bool   { return false }
func (f *fakeEnv) Reinstated(int)      { f.calls = append(f.calls, "reinstated") }
func (f *fakeEnv) CloseOut(int)        { f.calls = append(f.calls, "close-out") }
func (f *fakeEnv) StopIncarnation(int) {}

func (f *fakeEnv) FollowSink(int) func(string) {
	return func(m string) { f.out = append(f.out, "follow "+m) }
}

func (f *fakeEnv) EndFollow(int) func(string) {
	return func(m string) { f.out = append(f.out, "unavailable "+m) }
}

func (f *fakeEnv) LateSealUndone(_ int, err error) {
	f.calls = append(f.calls, fmt.Sprintf("late seal undone (err %v)", err))
}

func (f *fakeEnv) IsRequest(m string) bool { return strings.HasPrefix(m, "req") }

func (f *fakeEnv) Refuse(_ int, m string, why Refusal) {
	f.out = append(f.out, fmt.Sprintf("refuse %s (%d)", m, why))
}

func (f *fakeEnv) QueryCapability() handoff.Event {
	return handoff.CapabilityAnswered{Supported: true, ReceiveChunkLimit: 64 << 10}
}
func (f *fakeEnv) Admit() handoff.Event { return handoff.Admitted{} }
func (f *fakeEnv) CheckSource()         { f.calls = append(f.calls, "check source") }
func (f *fakeEnv) EncodePayload() (envelope.Stream, error) {
	return envelope.Whole(make([]byte, 100)), nil
}
func (f *fakeEnv) SendPrepare(handoff.SendPrepare) {}
func (f *fakeEnv) SendChunks(handoff.SendChunks)   {}
func (f *fakeEnv) SendAbort(handoff.SendAbort)     {}

func (f *fakeEnv) EncodeRelay(_ int, m string) ([]byte, any, error) { return []byte(m), nil, nil }
func (f *fakeEnv) RelayRefused(int, string, error)                  {}

func (f *fakeEnv) SendRelay(b Relayed[string], epoch uint32, again bool) {
	f.out = append(f.out, fmt.Sprintf("relay %s #%d epoch %d again %v", b.Msg, b.Index, epoch, again))
}

func (f *fakeEnv) SendCutover(epoch uint32, sum handoff.RelaySum) {
	f.out = append(f.out, fmt.Sprintf("cutover epoch %d count %d crc %d", epoch, sum.Count, sum.CRC))
}

func (f *fakeEnv) BoundTo(int) (string, string) { return f.owner, "a" }
func (f *fakeEnv) SendSessionSeal(int)          { f.calls = append(f.calls, "session seal") }
func (f *fakeEnv) SendSessionAbort(int)         { f.calls = append(f.calls, "session abort") }
func (f *fakeEnv) DropBinding(int, string) {
	f.owner = ""
	f.calls = append(f.calls, "binding dropped")
}
func (f *fakeEnv) SessionOwnersGone(owners []string) (map[string]bool, bool) {
	f.calls = append(f.calls, "owners looked up: "+strings.Join(owners, ","))
	return f.gone, true
}
func (f *fakeEnv) Reconcile()                      {}
func (f *fakeEnv) ConfirmCommit(uint64, time.Time) {}

func (f *fakeEnv) FenceOut(read string, version uint64) {
	f.calls = append(f.calls, fmt.Sprintf("fence-out %s at %d", read, version))
}

func (f *fakeEnv) NoFenceOutRead(version uint64) {
	f.calls = append(f.calls, fmt.Sprintf("no read at %d", version))
}

func (f *fakeEnv) StartTimer(handoff.StartTimer) {}
func (f *fakeEnv) StopTimer(handoff.Timer)       {}
func (f *fakeEnv) StopTimers(keep handoff.Timer) {
	f.calls = append(f.calls, fmt.Sprintf("stop timers but %d", keep))
}
func (f *fakeEnv) PayloadReleased() { f.calls = append(f.calls, "payload released") }
func (f *fakeEnv) ReturnBudget()    { f.calls = append(f.calls, "budget returned") }
func (f *fakeEnv) BoundaryUnacknowledged(batch []Relayed[string]) {
	f.calls = append(f.calls, fmt.Sprintf("unacknowledged %d", len(batch)))
}
func (f *fakeEnv) Log(handoff.Log)                    {}
func (f *fakeEnv) Problem(int, string, error, string) {}
func (f *fakeEnv) Complete(err error) {
	f.calls = append(f.calls, fmt.Sprintf("complete (err %v)", err != nil))
}
func (f *fakeEnv) Ended()     { f.calls = append(f.calls, "ended") }
func (f *fakeEnv) Forgotten() { f.calls = append(f.calls, "forgotten") }

// paused starts a move and seals it with saved in the queue.
func paused(t *testing.T, saved ...string) (*Run[string, string], *fakeEnv) {
	t.Helper()
	r, env := newRun(t)
	env.post(saved...)
	r.Step(handoff.Start{})
	require.Equal(t, []string{"seal"}, env.calls)
	env.sealNow()
	require.Equal(t, handoff.SourcePaused, r.Machine().Phase())
	return r, env
}

func sumOf(items ...string) handoff.RelaySum {
	var s handoff.RelaySum
	for _, it := range items {
		s = s.Add([]byte(it))
	}
	return s
}

// After a fence-out that followed the cutover, the source serves again
// with the saved work, then the relayed batch, then what was held since
// the cutover, ahead of later posts.
// Reference: docs/PROTOCOL.md §6.5 (a target lost after relay-ready).
func TestReinstateServesSavedThenRelayedThenHeld(t *testing.T) {
	r, env := paused(t, "s1", "s2")
	env.post("p1", "req-p2") // while sealed: the ingress hold
	r.Step(handoff.RelayReadyReceived{})
	env.post("h1", "req-h2") // after the cutover: held, requests too
	sum := sumOf("p1", "req-p2")
	require.Equal(t, []string{
		"relay p1 #0 epoch 0 again false",
		"relay req-p2 #1 epoch 0 again false",
		fmt.Sprintf("cutover epoch 0 count %d crc %d", sum.Count, sum.CRC),
	}, env.out, "the cutover goes after the last relayed record, with their sum")
	require.Len(t, r.Batch(), 2)

	r.Step(handoff.ReconcileAnswered{FencedOut: true})
	require.Equal(t, open, env.mode)
	require.Equal(t, []string{"s1", "s2", "p1", "req-p2", "h1", "req-h2"}, env.queue)
	require.Len(t, env.out, 3, "nothing followed or refused")
	require.Contains(t, env.calls, "reinstated")
	require.Less(t, index(env.calls, "reinstated"), index(env.calls, "payload released"))
}

// A relay-ready that arrives while the move is reconciled: the sends
// parked meanwhile are the head of the ingress hold, and a request was
// refused at once rather than parked.
// Reference: docs/PROTOCOL.md §6.4, §5.8.
func TestRelayReleasesParkedSendsFirst(t *testing.T) {
	r, env := paused(t, "s1")
	env.post("p1")
	r.Step(handoff.TimerFired{Timer: handoff.TimerRestoreDeadline})
	r.Step(handoff.ReconcileAnswered{}) // FailHeld: park
	require.Equal(t, redirecting, env.mode)
	env.post("p2", "req-x", "p3")
	require.Equal(t, []string{fmt.Sprintf("refuse req-x (%d)", RefuseReconciling)}, env.out)
	env.out = nil

	r.Step(handoff.RelayReadyReceived{})
	env.post("h1")
	sum := sumOf("p1", "p2", "p3")
	require.Equal(t, []string{
		"relay p1 #0 epoch 0 again false",
		"relay p2 #1 epoch 0 again false",
		"relay p3 #2 epoch 0 again false",
		fmt.Sprintf("cutover epoch 0 count %d crc %d", sum.Count, sum.CRC),
	}, env.out)
	require.Nil(t, r.Parts[0].Parked)
	require.Equal(t, []string{"h1"}, r.Parts[0].Held.Waiting())
}

// A move that fails while reconciling gives the source its queue back:
// the saved work first, then the sends parked meanwhile, then later posts.
// Reference: docs/PROTOCOL.md §6.4, §6.7 (SourcePaused → SourceRunning).
func TestUnsealPutsParkedSendsBehindTheSavedWork(t *testing.T) {
	r, env := paused(t, "s1", "s2")
	env.post("p1")
	r.Step(handoff.TimerFired{Timer: handoff.TimerRestoreDeadline})
	r.Step(handoff.ReconcileAnswered{})
	env.post("p2")
	r.Step(handoff.ReconcileAnswered{FencedOut: true})
	require.Equal(t, open, env.mode)
	require.Equal(t, []string{"s1", "s2", "p1", "p2"}, env.queue)
	require.Nil(t, r.Parts[0].Parked)
	require.False(t, r.Parts[0].Sealed)
	require.True(t, r.Ended())
	require.Equal(t, 1, count(env.calls, "ended"))
	require.Equal(t, 1, count(env.calls, fmt.Sprintf("stop timers but %d", handoff.TimerStub)), "only the stub timer survives the end")
}

// Once the commit shows and the target has acknowledged the boundary
// batch, what the hold kept since the cutover follows to the target first,
// in order, then every later message.
// Reference: docs/PROTOCOL.md §5.9, §5.13, §5.14.
func TestHeldMessagesFollowBeforeLaterOnes(t *testing.T) {
	r, env := paused(t)
	r.Step(handoff.RelayReadyReceived{})
	env.post("h1", "req-h2")
	env.out = nil
	r.Step(handoff.ReconcileAnswered{TargetOwns: true})
	env.post("req-h3")
	require.Empty(t, env.out, "held until the target acknowledges the batch")
	r.Step(handoff.BoundaryAcked{})
	env.post("later")
	require.Equal(t, []string{"follow h1", "follow req-h2", "follow req-h3", "follow later"}, env.out)
	require.Nil(t, r.Parts[0].Held)
}

// A seal that takes effect after the move gave up waiting for it is
// undone: the participant serves again with what it held, in order.
// Reference: docs/PROTOCOL.md §5.15.
func TestLateSealIsUndone(t *testing.T) {
	r, env := newRun(t)
	r.Step(handoff.Start{})
	r.Step(handoff.TimerFired{Timer: handoff.TimerSealPatience})
	require.False(t, r.Awaiting())
	env.post("m1", "m2")
	env.sealNow()
	require.Equal(t, open, env.mode)
	require.Equal(t, []string{"m1", "m2"}, env.queue)
	require.Contains(t, env.calls, "late seal undone (err <nil>)")
}

// A fence-out writes over the record the last successful read saw, and
// only at that version; a failed read keeps the last record.
// Reference: docs/FAULTS.md (the fence-out), docs/PROTOCOL.md §6.5.
func TestFenceOutCASesTheRecordReadAtItsVersion(t *testing.T) {
	r, env := paused(t)
	r.Read(handoff.ReconcileRead{Record: handoff.RecordView{Present: true, Version: 5}}, "r5")
	r.Read(handoff.ReconcileRead{Err: errors.New("store unavailable")}, "garbage")
	r.effect(handoff.FenceOut{Version: 5})
	r.effect(handoff.FenceOut{Version: 4})
	r.Read(handoff.ReconcileRead{Record: handoff.RecordView{}}, "none") // no record
	r.effect(handoff.FenceOut{Version: 5})
	require.Equal(t, []string{"fence-out r5 at 5", "no read at 4", "no read at 5"}, tail(env.calls, 3))
}

// The boundary batch is resent whole, as first sent, with the new epoch
// and the same sum; dropping it unacknowledged is loud.
// Reference: docs/PROTOCOL.md §5.9 (boundary resends).
func TestResendBoundaryRepeatsTheBatch(t *testing.T) {
	r, env := paused(t)
	env.post("p1")
	r.Step(handoff.RelayReadyReceived{})
	env.out = nil
	r.effect(handoff.ResendBoundary{Epoch: 2})
	sum := sumOf("p1")
	require.Equal(t, []string{"relay p1 #0 epoch 2 again true", fmt.Sprintf("cutover epoch 2 count %d crc %d", sum.Count, sum.CRC)}, env.out)
	r.effect(handoff.ReleaseBoundary{Unacknowledged: true})
	require.Equal(t, "unacknowledged 1", env.calls[len(env.calls)-1])
	require.Empty(t, r.Batch())
}

func index(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

func count(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

func tail(xs []string, n int) []string { return xs[max(0, len(xs)-n):] }
