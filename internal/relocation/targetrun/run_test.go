package targetrun

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var (
	testID   = handoff.Identity{RelocationID: 7, TargetAttemptGeneration: 1, Fence: handoff.Fence{NodeRid: "src", NodeGeneration: 1, OwnerGeneration: 3}}
	testKey  = location.Key(location.KindActor, "a")
	deadline = time.Unix(1000, 0)
	joinSpot = &messages.Membership{SpotId: "s", SpotGeneration: 2}
)

// fakeEnv is a target host whose primitives log what they were asked, in
// order. Messages are strings; "join" is a Join callback. Its store holds
// one record and answers at once; attempts' answers wait in answers until
// the test feeds them (a commit answers later on a real host).
type fakeEnv struct {
	run     *Run[string]
	work    []Work[string] // what Decode finds
	calls   []string
	opened  []string // the object's backlog at the open
	members [][]string
	rec     location.Versioned // the store's record
	casErr  error
	verif   *location.Versioned
	join    bool // the commit carries a Join
	// released: ReleaseJoin's calls, and the calls recorded before each.
	released []int
	answers  []func()
	removed  [][]string
	failAt   int // Install of this participant fails (-1: none)
	// VerifySource: the pending answers of the peer check and reads, the
	// slots' answer, the pending pause.
	peer     func(error)
	reads    []func(location.Versioned, error)
	slotsErr error
	later    func(expired bool)
	// precheck: the record a source check before the seal found (nil:
	// none), and its pending answer once Prechecked was asked.
	precheck *location.Versioned
	checked  func()
}

func (f *fakeEnv) call(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeEnv) Gone() bool                              { return false }
func (f *fakeEnv) Stepped(handoff.Event, []handoff.Effect) {}
func (f *fakeEnv) Before(handoff.Effect)                   {}
func (f *fakeEnv) Install(i int) error {
	f.call("install %d", i)
	if i == f.failAt {
		return errors.New("no room")
	}
	return nil
}

// VerifyPeer logs "verify" and keeps the answer: the tests step
// SourceVerified themselves, but for TestVerifySource's.
func (f *fakeEnv) VerifyPeer(answer func(error)) { f.call("verify"); f.peer = answer }
func (f *fakeEnv) ReadSource(answer func(location.Versioned, error)) {
	f.call("read")
	f.reads = append(f.reads, answer)
}
func (f *fakeEnv) ObjectGeneration() uint64 { return 1 }
func (f *fakeEnv) Prechecked(answer func(location.Versioned)) bool {
	if f.precheck == nil {
		return false
	}
	f.call("prechecked")
	v := *f.precheck
	f.checked = func() { answer(v) }
	return true
}
func (f *fakeEnv) VerifyMembers(_ location.Versioned, answer func(error)) {
	f.call("members")
	answer(nil)
}
func (f *fakeEnv) TakeSlots(answer func(error))      { f.call("slots"); answer(f.slotsErr) }
func (f *fakeEnv) KeepVerified(v location.Versioned) { f.call("keep"); f.verif = &v }
func (f *fakeEnv) After(d time.Duration, fn func(expired bool)) {
	f.call("after %s", d)
	f.later = fn
}
func (f *fakeEnv) SendCredit(uint64)                     {}
func (f *fakeEnv) SendFailed(e handoff.SendFailed)       { f.call("failed %s", e.Reason) }
func (f *fakeEnv) SendRelayReady()                       { f.call("relay-ready") }
func (f *fakeEnv) AckBoundary()                          { f.call("ack") }
func (f *fakeEnv) SendOwnerCommitted()                   { f.call("owner-committed") }
func (f *fakeEnv) UpdateSessionRoutes()                  { f.call("routes") }
func (f *fakeEnv) Decode([]byte) ([]Work[string], error) { f.call("decode"); return f.work, nil }
func (f *fakeEnv) Restore(i int) error                   { f.call("restore %d", i); return nil }
func (f *fakeEnv) IsJoinCallback(m string) bool          { return strings.HasPrefix(m, "join") }
func (f *fakeEnv) Serving()                              { f.call("serving") }
func (f *fakeEnv) ReleaseJoin()                          { f.released = append(f.released, len(f.calls)) }
func (f *fakeEnv) Deliver(i int, m string)               { f.call("deliver %d %s", i, m) }
func (f *fakeEnv) StopIncarnation(i int)                 { f.call("stop %d", i) }
func (f *fakeEnv) JoinRefused(*handoff.Commit)           { f.call("join refused") }
func (f *fakeEnv) StartTimer(handoff.StartTimer)         {}
func (f *fakeEnv) StopTimer(handoff.Timer)               {}
func (f *fakeEnv) StopTimers()                           { f.call("stop timers") }
func (f *fakeEnv) Log(handoff.Log)                       {}
func (f *fakeEnv) Complete(err error)                    { f.call("complete %v", err) }
func (f *fakeEnv) Forgotten()                            { f.call("forgotten") }

func (f *fakeEnv) Problem(i int, event string, err error, _ string) {
	f.call("problem %d %s %v", i, event, err)
}

// PartOf: an item "2:x" is participant 2's x.
func (f *fakeEnv) PartOf(item any) (int, string) {
	s := item.(string)
	if p, m, ok := strings.Cut(s, ":"); ok {
		return int(p[0] - '0'), m
	}
	return 0, s
}

func (f *fakeEnv) JoinCallback(c handoff.Committed) (string, bool) { return "join-new", c.Joined }

func (f *fakeEnv) OpenMembers(b [][]string) { f.members = b; f.call("open members") }

func (f *fakeEnv) Open(backlog []string, relayed int, c handoff.Committed) error {
	f.opened = append([]string(nil), backlog...)
	f.call("open (relayed %d, member %s)", relayed, c.Member.GetSpotId())
	return nil
}

func (f *fakeEnv) Remove(i int, saved []string) {
	f.call("remove %d", i)
	f.removed = append(f.removed, saved)
}

func (f *fakeEnv) CommitPlan(settleOnly bool) *handoff.Commit {
	c := &handoff.Commit{
		ID: testID, Key: testKey, Owner: &messages.Owner{NodeRid: "dst", NodeGeneration: 1},
		NewOwnerGeneration: 4, ObjectGeneration: 1, SettleOnly: settleOnly, RestoreDeadline: deadline,
		Session: &messages.SessionBinding{}, IsEntrySpot: func(string) bool { return false },
	}
	if f.join {
		c.Join = joinSpot
	}
	return c
}

func (f *fakeEnv) TakeVerified() (location.Versioned, bool) {
	if v := f.verif; v != nil {
		f.verif = nil
		return *v, true
	}
	return location.Versioned{}, false
}

func (f *fakeEnv) Commit(c *handoff.Commit, attempt func(Store, func(handoff.Event, handoff.Committed))) {
	f.call("commit settle=%v", c.SettleOnly)
	attempt(fakeStore{f}, func(ev handoff.Event, got handoff.Committed) {
		f.answers = append(f.answers, func() { f.run.Answered(ev, got) })
	})
}

// answer feeds the commit answers that came.
func (f *fakeEnv) answer() {
	a := f.answers
	f.answers = nil
	for _, fn := range a {
		fn()
	}
}

type fakeStore struct{ f *fakeEnv }

func (s fakeStore) Read(key location.AuthorityKey, answer func(location.Versioned, error)) {
	s.f.call("read %s", key.ID)
	if !s.f.rec.Present() {
		answer(location.Versioned{}, location.ErrNotFound)
		return
	}
	answer(s.f.rec, nil)
}

func (s fakeStore) ReadAll(keys []location.AuthorityKey, answer func([]location.Versioned, error)) {
	s.f.call("read-all %d", len(keys))
	vs := make([]location.Versioned, len(keys))
	for i, k := range keys {
		vs[i] = location.Versioned{Key: k, Version: 9, Record: &location.Record{
			Owner: &messages.Owner{NodeRid: "dst", NodeGeneration: 1}, AuthorityOwnerGeneration: 1, ObjectGeneration: joinSpot.SpotGeneration,
			State: messages.LifecycleState_LIFECYCLE_STATE_READY,
		}}
	}
	answer(vs, nil)
}

func (s fakeStore) CAS(op location.Op, answer func(error)) {
	s.f.call("cas %s@%d owner %s og %d reloc %d", op.Key.ID, op.Version, op.Record.GetOwner().GetNodeRid(),
		op.Record.GetAuthorityOwnerGeneration(), op.Record.GetRelocationId())
	answer(s.f.casErr)
}

func (s fakeStore) Apply(ops []location.Op, answer func(error)) {
	s.f.call("apply %d ops", len(ops))
	answer(s.f.casErr)
}

// atSource is the object's record naming the move's source at its fence.
func atSource() location.Versioned {
	return location.Versioned{Key: testKey, Version: 5, Record: &location.Record{
		Owner: &messages.Owner{NodeRid: "src", NodeGeneration: 1}, AuthorityOwnerGeneration: 3, ObjectGeneration: 1,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY,
	}}
}

// newRun is a move of parts participants into the fake, prepared.
func newRun(t *testing.T, parts int) (*Run[string], *fakeEnv, []envelope.Chunk) {
	t.Helper()
	m, chunks, err := envelope.Split(make([]byte, 300), 100)
	require.NoError(t, err)
	f := &fakeEnv{rec: atSource(), failAt: -1}
	tg, effects := handoff.NewTarget(testID, handoff.DefaultConfig(), handoff.PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
	f.run = New[string](tg, f, parts)
	f.run.Run(effects)
	return f.run, f, chunks
}

// restored steps the run through its payload, every participant
// answering its restore, and the source check.
func restored(t *testing.T, r *Run[string], f *fakeEnv, chunks []envelope.Chunk) {
	t.Helper()
	r.Step(handoff.SourceVerified{})
	for _, c := range chunks {
		r.Step(handoff.ChunkReceived{Chunk: c})
	}
	for i := range r.Parts {
		r.Restored(i, nil)
	}
	require.Equal(t, handoff.RelayReady, r.Machine().Phase())
}

// relayAndCutover relays items (epoch 0) and sends the matching cutover.
func relayAndCutover(r *Run[string], items ...string) {
	var sum handoff.RelaySum
	for i, it := range items {
		rec := []byte(it)
		sum = sum.Add(rec)
		r.Step(handoff.RelayRecordReceived{Index: i, Record: rec, Item: it})
	}
	r.Step(handoff.CutoverReceivedEvent{Sum: sum})
}

// The open's backlog is the saved work in its order (timer ticks among
// it by order), then the relayed records; the CAS names this node at the
// new owner generation with the move's RelocationId, at the version read.
func TestOpenBacklogIsSavedThenRelayed(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	require.Equal(t, []string{"install 0", "verify"}, f.calls)
	f.work = []Work[string]{{1, 3, "s3", "saved work"}, {1, 1, "s1", "saved work"}, {1, 2, "tick2", "a timer tick"}}
	restored(t, r, f, chunks)
	f.calls = nil
	relayAndCutover(r, "r1", "r2")
	require.Equal(t, []string{"ack", "commit settle=false", "read a", "cas a@5 owner dst og 4 reloc 7"}, f.calls)
	f.calls = nil
	f.answer()
	require.Equal(t, []string{"s1", "tick2", "s3", "r1", "r2"}, f.opened)
	require.Equal(t, []string{"open members", "open (relayed 2, member )", "serving", "owner-committed", "complete <nil>"}, f.calls)
	require.Equal(t, []int{3, 4}, f.released, "a Join's hold goes once the object serves, and again (idempotent) at the end")
}

// Restored comes once every participant's restore answered, not before.
func TestRestoredWaitsForEveryParticipant(t *testing.T) {
	r, f, chunks := newRun(t, 3)
	require.Equal(t, []string{"install 0", "install 1", "install 2", "verify"}, f.calls)
	r.Step(handoff.SourceVerified{})
	for _, c := range chunks {
		r.Step(handoff.ChunkReceived{Chunk: c})
	}
	require.Contains(t, f.calls, "restore 2")
	r.Restored(0, nil)
	r.Restored(2, nil)
	require.Equal(t, handoff.TargetRestoring, r.Machine().Phase())
	r.Restored(1, nil)
	require.Equal(t, handoff.RelayReady, r.Machine().Phase())
}

// A participant's restore failing removes the move, whatever the others
// answer.
func TestRestoreFailureRemoves(t *testing.T) {
	r, f, chunks := newRun(t, 2)
	r.Step(handoff.SourceVerified{})
	for _, c := range chunks {
		r.Step(handoff.ChunkReceived{Chunk: c})
	}
	r.Restored(1, errors.New("adapter"))
	r.Restored(0, nil)
	require.Equal(t, handoff.TargetRemoved, r.Machine().Phase())
	require.Contains(t, f.calls, "remove 1")
}

// Saved work naming a participant the move does not have is a conflict:
// the move is refused before anything is restored.
func TestSavedWorkOfAnUnknownParticipantIsRefused(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	f.work = []Work[string]{{1, 1, "s1", "saved work"}, {2, 1, "x", "a timer tick"}}
	r.Step(handoff.SourceVerified{})
	for _, c := range chunks {
		r.Step(handoff.ChunkReceived{Chunk: c})
	}
	require.Equal(t, handoff.TargetRemoved, r.Machine().Phase())
	require.NotContains(t, f.calls, "restore 0")
	var complete string
	for _, c := range f.calls {
		if strings.HasPrefix(c, "complete") {
			complete = c
		}
	}
	require.Contains(t, complete, "a timer tick of participant 2, the move has 1")
}

// Each participant gets its own share of the relay after its saved work;
// the members' backlogs are handed over before the object's queue opens.
func TestMembersGetTheirShare(t *testing.T) {
	r, f, chunks := newRun(t, 3)
	f.work = []Work[string]{{2, 1, "m1s", "saved work"}, {1, 1, "s", "saved work"}, {3, 1, "m2s", "saved work"}}
	restored(t, r, f, chunks)
	f.calls = nil
	relayAndCutover(r, "1:m1r", "r", "2:m2r", "1:m1r2")
	f.answer()
	require.Equal(t, [][]string{{"m1s", "m1r", "m1r2"}, {"m2s", "m2r"}}, f.members)
	require.Equal(t, []string{"s", "r"}, f.opened)
	require.Equal(t, []string{"open members", "open (relayed 1, member )", "serving", "owner-committed", "complete <nil>"}, f.calls[len(f.calls)-5:])
}

// The Join callback of the commit comes after an earlier Join's callback
// still in the saved work, before everything else that moved.
func TestJoinCallbackKeepsTheCommitsOrder(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	f.join = true
	f.work = []Work[string]{{1, 1, "a", "saved work"}, {1, 2, "join-old", "saved work"}, {1, 3, "b", "saved work"}}
	restored(t, r, f, chunks)
	relayAndCutover(r, "r")
	require.Contains(t, f.calls, "apply 2 ops", "the join's transaction")
	f.answer()
	require.Equal(t, []string{"a", "join-old", "join-new", "b", "r"}, f.opened)
	require.Contains(t, f.calls, "open (relayed 1, member s)")
}

// A commit that applied but whose answer was lost is found on the next
// attempt's read: committed, with what it wrote (the Join) kept for the
// open.
func TestCommitFoundByTheNextRead(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	f.join = true
	restored(t, r, f, chunks)
	f.casErr = fmt.Errorf("%w: lost", location.ErrIndeterminate)
	relayAndCutover(r)
	f.answer()
	require.Equal(t, handoff.StoreRetry, r.Machine().Phase())
	rec := atSource()
	rec.Version = 6
	rec.Record.Owner = &messages.Owner{NodeRid: "dst", NodeGeneration: 1}
	rec.Record.AuthorityOwnerGeneration, rec.Record.RelocationId, rec.Record.Membership = 4, 7, joinSpot
	f.rec, f.calls = rec, nil
	r.Step(handoff.TimerFired{Timer: handoff.TimerStoreRetry})
	require.Equal(t, []string{"commit settle=false", "read a"}, f.calls)
	f.answer()
	require.Equal(t, []string{"join-new"}, f.opened)
}

// The record VerifySource read saves the first attempt's read; a
// settling attempt reads again even when one is kept.
func TestVerifiedRecordSavesARead(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	restored(t, r, f, chunks)
	v := atSource()
	f.verif, f.rec = &v, location.Versioned{}
	f.calls = nil
	relayAndCutover(r)
	require.Equal(t, []string{"ack", "commit settle=false", "cas a@5 owner dst og 4 reloc 7"}, f.calls)

	r, f, chunks = newRun(t, 1)
	restored(t, r, f, chunks)
	f.calls = nil
	f.casErr = fmt.Errorf("%w: lost", location.ErrIndeterminate)
	relayAndCutover(r)
	f.answer()
	f.verif, f.calls = &v, nil
	r.Step(handoff.TimerFired{Timer: handoff.TimerRestoreDeadline})
	require.Equal(t, []string{"commit settle=true", "read a", "cas a@5 owner src og 3 reloc 7"}, f.calls,
		"the fence-out: the move's RelocationId, owner unchanged")
}

// A record that is gone is the core's ReadMissing; a read that fails is
// retried, never judged.
func TestReadAnswers(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	restored(t, r, f, chunks)
	f.rec = location.Versioned{}
	relayAndCutover(r)
	f.answer()
	require.Equal(t, handoff.TargetRemoved, r.Machine().Phase())
	ended := false
	for _, c := range f.calls {
		ended = ended || strings.HasPrefix(c, "complete ") && c != "complete <nil>"
	}
	require.True(t, ended, "the move ends without a commit")
	require.Empty(t, f.opened)
}

// A removed target drops its restored saved work with its incarnation; a
// forgotten run stops its timers and steps nothing more.
func TestRemoveThenForget(t *testing.T) {
	r, f, chunks := newRun(t, 1)
	f.work = []Work[string]{{1, 1, "s1", "saved work"}}
	restored(t, r, f, chunks)
	r.Step(handoff.TimerFired{Timer: handoff.TimerRestoreDeadline})
	require.Equal(t, [][]string{{"s1"}}, f.removed)
	require.Nil(t, r.Parts[0].Saved)
	f.calls = nil
	r.Step(handoff.TimerFired{Timer: handoff.TimerForget})
	require.Equal(t, []string{"stop timers", "forgotten"}, f.calls[len(f.calls)-2:])
	require.True(t, r.Forgotten())
	f.calls = nil
	r.Step(handoff.TimerFired{Timer: handoff.TimerForget})
	require.Empty(t, f.calls)
}

// After a fallback, a relayed record that comes once dispatch is open
// goes to its participant.
func TestLateRecordGoesToItsParticipant(t *testing.T) {
	r, f, chunks := newRun(t, 2)
	restored(t, r, f, chunks)
	r.Step(handoff.RelayRecordReceived{Index: 0, Record: []byte("r"), Item: "r"})
	r.Step(handoff.TimerFired{Timer: handoff.TimerCutoverWait})
	f.answer()
	require.Equal(t, []string{"r"}, f.opened)
	f.calls = nil
	r.Step(handoff.RelayRecordReceived{Index: 1, Record: []byte("x"), Item: "1:x"})
	require.Equal(t, []string{"deliver 1 x"}, f.calls)
}

// The events effects produce are fed after every effect of their round:
// an install that fails removes the move only after the rest of the
// prepare's effects ran (VerifySource among them), and stops at the first
// participant that failed.
func TestEffectsOfARoundRunBeforeItsEvents(t *testing.T) {
	m, _, err := envelope.Split(make([]byte, 300), 100)
	require.NoError(t, err)
	f := &fakeEnv{rec: atSource(), failAt: 1}
	tg, effects := handoff.NewTarget(testID, handoff.DefaultConfig(), handoff.PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
	f.run = New[string](tg, f, 3)
	f.run.Run(effects)
	require.Equal(t, []string{"install 0", "install 1", "verify", "failed FAILURE_REASON_RESTORE_FAILED", "remove 0", "remove 1", "remove 2"}, f.calls[:7])
	require.Equal(t, handoff.TargetRemoved, tg.Phase())
}

// VerifySource tries again, paced by handoff.VerifyAgain, only while the
// answers say nothing of the source (an unreachable peer, an unavailable
// store); a record at the fence takes the slots and is kept for the
// commit before relay-ready; a pause that reaches the restore deadline
// answers with the last error.
// Reference: PROTOCOL.md §5.7
func TestVerifySource(t *testing.T) {
	r, f, _ := newRun(t, 1)
	require.Contains(t, f.calls, "verify")
	f.calls = nil
	f.peer(fmt.Errorf("%w: peer", roamerr.ErrUnavailable))
	require.Equal(t, []string{"after " + handoff.FirstVerifyWait.String()}, f.calls)
	f.later(false)
	f.peer(nil)
	f.reads[0](location.Versioned{}, fmt.Errorf("%w: store", location.ErrUnavailable))
	require.Equal(t, []string{"after 5ms", "verify", "read", "after 10ms"}, f.calls)
	require.Equal(t, handoff.TargetRestoring, r.Machine().Phase())

	f.calls = nil
	f.later(false)
	f.peer(nil)
	f.reads[1](atSource(), nil)
	require.Equal(t, []string{"verify", "read", "members", "slots", "keep"}, f.calls)
	v, ok := f.TakeVerified()
	require.True(t, ok)
	require.Equal(t, atSource().Version, v.Version)

	// A record naming another owner ends the tries at once.
	r, f, _ = newRun(t, 1)
	f.peer(nil)
	moved := atSource()
	moved.Record.Owner.NodeRid = "other"
	f.calls = nil
	f.reads[0](moved, nil)
	require.Empty(t, f.calls[:slices.Index(f.calls, "failed FAILURE_REASON_STALE")])
	require.Equal(t, handoff.TargetRemoved, r.Machine().Phase())

	// The deadline ends a pause: the last error answers, as a deadline
	// (it said nothing of the source), never as stale.
	r, f, _ = newRun(t, 1)
	f.peer(fmt.Errorf("%w: peer", roamerr.ErrUnavailable))
	f.calls = nil
	f.later(true)
	require.Equal(t, handoff.TargetRemoved, r.Machine().Phase())
	require.Contains(t, f.calls, "failed FAILURE_REASON_DEADLINE")
	require.NotContains(t, f.calls, "failed FAILURE_REASON_STALE")
}

// A move whose source check before the seal passed neither checks the
// source's node nor reads the record again: the record that check found
// backs the move (its version is the first CAS's), answered in a later
// turn, never within the VerifySource effect.
func TestPrecheckedSourceIsNotReadAgain(t *testing.T) {
	m, chunks, err := envelope.Split(make([]byte, 300), 100)
	require.NoError(t, err)
	rec := atSource()
	f := &fakeEnv{rec: atSource(), failAt: -1, precheck: &rec}
	tg, effects := handoff.NewTarget(testID, handoff.DefaultConfig(), handoff.PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
	f.run = New[string](tg, f, 1)
	f.run.Run(effects)
	require.Contains(t, f.calls, "prechecked")
	require.NotContains(t, f.calls, "verify")
	require.NotContains(t, f.calls, "read")
	require.NotContains(t, f.calls, "keep", "answered within the effect")

	for _, c := range chunks {
		f.run.Step(handoff.ChunkReceived{Chunk: c})
	}
	f.run.Restored(0, nil)
	require.Equal(t, handoff.TargetRestoring, f.run.Machine().Phase(), "relay-ready before the source is backed")
	f.calls = nil
	f.checked()
	require.Equal(t, []string{"members", "slots", "keep", "relay-ready"}, f.calls[:4])
	require.Equal(t, handoff.RelayReady, f.run.Machine().Phase())
	v, ok := f.TakeVerified()
	require.True(t, ok)
	require.Equal(t, rec.Version, v.Version)
}
