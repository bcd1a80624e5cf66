package spotservice

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

type readAnswer struct {
	v   location.Versioned
	err error
}

type writeAnswer struct {
	outcome activation.Outcome
	v       location.StoreVersion
	err     error
}

// fakeClose is a CloseEnv answering from scripts, recording each call.
type fakeClose struct {
	t       *testing.T
	reads   []readAnswer // Read, then SettleRead
	writes  []writeAnswer
	fences  []error
	paces   int // how many Pace calls go on before the bound passes
	calls   []string
	written *location.Record
	done    []error
}

func (f *fakeClose) read(what string, done func(location.Versioned, error)) {
	if len(f.reads) == 0 {
		f.t.Fatalf("unexpected %s after %v", what, f.calls)
	}
	a := f.reads[0]
	f.reads = f.reads[1:]
	f.calls = append(f.calls, what)
	done(a.v, a.err)
}

func (f *fakeClose) Read(done func(location.Versioned, error))       { f.read("read", done) }
func (f *fakeClose) SettleRead(done func(location.Versioned, error)) { f.read("settle-read", done) }

func (f *fakeClose) WriteClosing(version location.StoreVersion, closing *location.Record, done func(activation.Outcome, location.StoreVersion, error)) {
	if len(f.writes) == 0 {
		f.t.Fatalf("unexpected write after %v", f.calls)
	}
	a := f.writes[0]
	f.writes = f.writes[1:]
	f.calls = append(f.calls, fmt.Sprintf("write@%d", version))
	f.written = closing
	done(a.outcome, a.v, a.err)
}

func (f *fakeClose) Fence(version location.StoreVersion, _ *location.Record, done func(error)) {
	if len(f.fences) == 0 {
		f.t.Fatalf("unexpected fence after %v", f.calls)
	}
	err := f.fences[0]
	f.fences = f.fences[1:]
	f.calls = append(f.calls, fmt.Sprintf("fence@%d", version))
	done(err)
}

func (f *fakeClose) Pace(again func()) bool {
	if f.paces == 0 {
		return false
	}
	f.paces--
	f.calls = append(f.calls, "pace")
	again()
	return true
}

func (f *fakeClose) Unsettled(error) { f.calls = append(f.calls, "unsettled") }

func (f *fakeClose) Release(closingAt location.StoreVersion, _ *location.Record, done func(error)) {
	f.calls = append(f.calls, fmt.Sprintf("release@%d", closingAt))
	done(nil)
}

func (f *fakeClose) Done(err error) { f.done = append(f.done, err) }

var (
	closeKey = location.Key(location.KindInstanceSpot, "s")
	me       = &messages.Owner{Mesh: "m", NodeRid: "n1", NodeGeneration: 1, LeaseId: "L1"}
)

func rec(version location.StoreVersion, gen uint64, st messages.LifecycleState) readAnswer {
	return readAnswer{v: location.Versioned{Key: closeKey, Version: version, Record: &location.Record{ObjectGeneration: gen, Owner: me, State: st}}}
}

const (
	stReady   = messages.LifecycleState_LIFECYCLE_STATE_READY
	stClosing = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
)

func runClose(t *testing.T, f *fakeClose) error {
	t.Helper()
	f.t = t
	CloseSelf(f, closeKey, 5, me)
	if len(f.done) != 1 {
		t.Fatalf("the close ended %d times (%v); want once", len(f.done), f.calls)
	}
	return f.done[0]
}

func wantCalls(t *testing.T, f *fakeClose, want ...string) {
	t.Helper()
	if !slices.Equal(f.calls, want) {
		t.Fatalf("calls %v, want %v", f.calls, want)
	}
}

// The Closing write lands on the Ready record read, then the Release
// machine runs from the version written.
func TestCloseSelfWritesClosingThenReleases(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady)}, writes: []writeAnswer{{activation.Applied, 4, nil}}}
	if err := runClose(t, f); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f, "read", "write@3", "release@4")
	if f.written.GetState() != stClosing {
		t.Fatalf("wrote %v, want a Closing record", f.written)
	}
}

// A lost race (the recovery pointer going, say) reads again and writes
// over the new version.
func TestCloseSelfReadsAgainAfterALostRace(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady), rec(4, 5, stReady)},
		writes: []writeAnswer{{activation.Lost, 0, nil}, {activation.Applied, 5, nil}}}
	if err := runClose(t, f); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f, "read", "write@3", "read", "write@4", "release@5")
}

// A record that is not this incarnation's Ready one ends the close Stale
// without a write; a failed read ends it typed.
func TestCloseSelfRefusesWithoutWriting(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 6, stReady)}}
	if err := runClose(t, f); !errors.Is(err, roamerr.ErrStale) {
		t.Fatalf("another generation: %v, want Stale", err)
	}
	wantCalls(t, f, "read")
	f = &fakeClose{reads: []readAnswer{{err: errors.New("down")}}}
	if err := runClose(t, f); !errors.Is(err, roamerr.ErrUnavailable) {
		t.Fatalf("failed read: %v, want Unavailable", err)
	}
	wantCalls(t, f, "read")
}

// A write that failed for sure is the close's error; only an unknown
// outcome is settled.
func TestCloseSelfFailedWriteIsNotSettled(t *testing.T) {
	boom := fmt.Errorf("%w: boom", roamerr.ErrUnavailable)
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady)}, writes: []writeAnswer{{activation.WriteFailed, 0, boom}}}
	if err := runClose(t, f); !errors.Is(err, boom) {
		t.Fatalf("%v, want the write's failure", err)
	}
	wantCalls(t, f, "read", "write@3")
}

var unknown = writeAnswer{activation.WriteFailed, 0, fmt.Errorf("%w: no answer", roamerr.ErrDeadlineExceeded)}

// An unknown Closing write that landed is found by re-reading, and the
// close goes on to release from the version read.
func TestCloseSelfSettlesALandedWrite(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady), {err: errors.New("flaky")}, rec(3, 5, stClosing), rec(4, 5, stClosing)},
		writes: []writeAnswer{unknown}, paces: 5}
	if err := runClose(t, f); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f, "read", "write@3", "settle-read", "pace", "settle-read", "pace", "settle-read", "release@4")
}

// An unknown Closing write still not landed is fenced by rewriting the
// Ready record at its version; the close then ends with the write's
// error and nothing is released. A failed fence reads again.
func TestCloseSelfFencesAWriteNotLanded(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady), rec(3, 5, stReady), rec(3, 5, stReady)},
		writes: []writeAnswer{unknown}, fences: []error{errors.New("flaky"), nil}, paces: 5}
	if err := runClose(t, f); !errors.Is(err, roamerr.ErrDeadlineExceeded) {
		t.Fatalf("%v, want the write's DeadlineExceeded", err)
	}
	wantCalls(t, f, "read", "write@3", "settle-read", "fence@3", "pace", "settle-read", "fence@3")
}

// Settling never ends by a timeout alone: it gives up only when its own
// bound passes, and says so.
func TestCloseSelfGivesUpSettlingLoudly(t *testing.T) {
	down := readAnswer{err: errors.New("down")}
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady), down, down}, writes: []writeAnswer{unknown}, paces: 1}
	err := runClose(t, f)
	if !errors.Is(err, roamerr.ErrUnavailable) {
		t.Fatalf("%v, want Unavailable", err)
	}
	wantCalls(t, f, "read", "write@3", "settle-read", "pace", "settle-read", "unsettled")
}

// A record moved on without the write (past its version, or to another
// owner or generation) ends the settling without a release.
func TestCloseSelfSettlesAWriteOvertaken(t *testing.T) {
	f := &fakeClose{reads: []readAnswer{rec(3, 5, stReady), rec(7, 5, stReady)}, writes: []writeAnswer{unknown}}
	if err := runClose(t, f); !errors.Is(err, roamerr.ErrDeadlineExceeded) {
		t.Fatalf("moved past: %v, want the write's error", err)
	}
	wantCalls(t, f, "read", "write@3", "settle-read")
	f = &fakeClose{reads: []readAnswer{rec(3, 5, stReady), rec(7, 6, stClosing)}, writes: []writeAnswer{unknown}}
	if err := runClose(t, f); !errors.Is(err, roamerr.ErrStale) {
		t.Fatalf("another generation: %v, want Stale", err)
	}
	wantCalls(t, f, "read", "write@3", "settle-read")
}
