package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// builder writes the records a counter would, one handler run at a time.
type builder struct {
	h     History
	t     int64
	state map[string][2]uint64 // obj → count, hash per incarnation's view
}

func newBuilder() *builder {
	return &builder{h: History{Killed: map[string]int64{}, SendLossWindow: int64(5 * time.Second)}, t: 1_000_000_000, state: map[string][2]uint64{}}
}

func (b *builder) tick() int64 { b.t += int64(time.Millisecond); return b.t }

func (b *builder) life(proc, sys string) {
	b.h.Lines = append(b.h.Lines, Line{K: LineLife, T: b.tick(), Proc: proc, Sys: sys, Rid: sys + "-rid"})
}

// handle applies op on obj in incarnation inc of proc/sys, from the state
// the builder tracks for key (so tests can fork lineages).
func (b *builder) handleFrom(key, proc, sys, inc, obj, op string) {
	st := b.state[key]
	l := Line{K: LineHandled, T: b.tick(), Proc: proc, Node: proc, Sys: sys, Inc: inc, Obj: obj, Op: op,
		Prev: st[0], PH: st[1], N: st[0] + 1, NH: NextHash(st[1], op)}
	b.state[key] = [2]uint64{l.N, l.NH}
	b.h.Lines = append(b.h.Lines, l)
}

func (b *builder) handle(proc, sys, inc, obj, op string) { b.handleFrom(obj, proc, sys, inc, obj, op) }

func (b *builder) op(obj, id string, send, ok bool) {
	t := b.tick()
	b.h.Ops = append(b.h.Ops, Op{ID: id, Obj: obj, Send: send, Entry: "p1", Start: t, End: t + 1, OK: ok})
}

// call handles and acknowledges a request.
func (b *builder) call(proc, sys, inc, obj, id string) {
	b.handle(proc, sys, inc, obj, id)
	b.op(obj, id, false, true)
}

func hasDetail(r Report, prefix string) bool {
	for _, d := range r.Details {
		if strings.HasPrefix(d, prefix) {
			return true
		}
	}
	return false
}

func TestCleanHistoryWithAMove(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2")
	b.call("p2", "s2", "roam/counter/a@1.2", "a", "a.3") // moved to p2
	b.handle("p2", "s2", "roam/counter/a@1.2", "a", "a.4")
	b.op("a", "a.4", true, true) // a send
	b.op("a", "a.5", false, false)
	b.h.Ops[len(b.h.Ops)-1].Class = "Unavailable"
	b.h.End = b.tick()
	r := Check(b.h)
	if !r.Safe() || r.LostEnded != 0 || r.Untyped != 0 {
		t.Fatalf("clean history reported %+v", r)
	}
	if r.Messages != 5 || r.Accepted != 4 || r.Handled != 4 || r.Errors["Unavailable"] != 1 {
		t.Fatalf("counts %+v", r)
	}
}

func TestLostAcceptedRequestNeverHandled(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.op("a", "a.2", false, true) // success reply, no handler record
	r := Check(b.h)
	if r.LostAccepted != 1 || !hasDetail(r, "lost accepted: op a.2") {
		t.Fatalf("want one lost accepted op, got %+v", r)
	}
}

func TestLostAcceptedStateRolledBackOnLiveNodes(t *testing.T) {
	// a.2 is applied and acknowledged, then the object carries on from
	// the state before it on a node that never ended: a lost update.
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	old := b.state["a"]
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2")
	b.state["a"] = old // the target restored a stale state
	b.call("p2", "s2", "roam/counter/a@1.2", "a", "a.3")
	r := Check(b.h)
	if r.LostAccepted != 1 || r.LostEnded != 0 || !hasDetail(r, "lost accepted: op a.2 handled") {
		t.Fatalf("want a.2 lost accepted, got %+v", r)
	}
}

func TestStateOfAKilledNodeIsLostWithIt(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2")
	b.h.Killed["p1"] = b.tick()
	b.t += int64(4 * time.Second) // the lease ends
	b.state["a"] = [2]uint64{}    // reactivated empty
	b.call("p2", "s2", "roam/counter/a@2.1", "a", "a.3")
	// A send accepted just before the kill and never handled.
	b.h.Ops = append(b.h.Ops, Op{ID: "a.s", Obj: "a", Send: true, Entry: "p1", Start: b.h.Killed["p1"] - 1000, End: b.h.Killed["p1"] - 500, OK: true})
	// A send accepted 3 s after the kill, routed to the dead owner.
	b.h.Ops = append(b.h.Ops, Op{ID: "a.t", Obj: "a", Send: true, Entry: "p2", Start: b.h.Killed["p1"] + 3e9 - 2e6, End: b.h.Killed["p1"] + 3e9, OK: true})
	r := Check(b.h)
	if r.LostAccepted != 0 || r.LostEnded != 4 || r.LostEndedSends != 2 || !r.Safe() {
		t.Fatalf("want 4 ops lost with the ended node and none lost accepted, got %+v", r)
	}
}

func TestLeaseEndedLifecycleCountsAsEnded(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.life("p1", "s1b") // p1 rejoined: s1's lease ended
	b.state["a"] = [2]uint64{}
	b.call("p2", "s2", "roam/counter/a@2.1", "a", "a.2")
	r := Check(b.h)
	if r.LostAccepted != 0 || r.LostEnded != 1 {
		t.Fatalf("want a.1 lost with the ended lifecycle, got %+v", r)
	}
}

func TestSendNeverHandledFarFromAnyEndingIsLost(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.op("a", "a.2", true, true)
	r := Check(b.h)
	if r.LostAccepted != 1 {
		t.Fatalf("want the send lost accepted, got %+v", r)
	}
}

func TestDuplicate(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2")
	b.handle("p1", "s1", "roam/counter/a@1.1", "a", "a.2") // applied again
	r := Check(b.h)
	if r.Duplicated != 1 || !hasDetail(r, "duplicated: op a.2 handled 2 times") {
		t.Fatalf("want one duplicate, got %+v", r)
	}
	if r.LostAccepted != 0 {
		t.Fatalf("a duplicate is not a loss: %+v", r)
	}
}

func TestTwoIncarnationsOverlap(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.call("p2", "s2", "roam/counter/a@1.2", "a", "a.2")
	// The old incarnation on p1 handles again after p2's did.
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.3")
	r := Check(b.h)
	if r.Overlaps != 1 || !hasDetail(r, "two incarnations: a: roam/counter/a@1.1") {
		t.Fatalf("want one overlap, got %+v", r)
	}
	// Same PID id in a new process (a restarted node) is a new incarnation,
	// and the old one may not come back either.
	b2 := newBuilder()
	b2.life("p1", "s1")
	b2.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b2.life("p1b", "s3")
	b2.call("p1b", "s3", "roam/counter/a@1.1", "a", "a.2")
	if r := Check(b2.h); r.Overlaps != 0 {
		t.Fatalf("a later incarnation alone is no overlap: %+v", r)
	}
	b2.call("p1", "s1", "roam/counter/a@1.1", "a", "a.3")
	if r := Check(b2.h); r.Overlaps != 1 {
		t.Fatalf("want the old process's incarnation reported, got %+v", r)
	}
}

func TestUnservedAfterHealAndUntyped(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.call("p1", "s1", "roam/counter/b@1.1", "b", "b.1")
	heal := b.tick()
	b.h.Heals = []int64{heal}
	b.t += int64(3 * time.Second)
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2") // a: 3 s after the heal
	b.op("b", "b.2", false, false)
	b.h.Ops[len(b.h.Ops)-1].Class, b.h.Ops[len(b.h.Ops)-1].Err = "untyped", "context deadline exceeded"
	b.t += int64(5 * time.Second)
	b.h.End = b.tick()
	b.h.MoveUntyped = []string{"boom"}
	r := Check(b.h)
	if r.NeverServed != 1 || r.UnservedObj != "b" || r.MaxUnserved < int64(8*time.Second) {
		t.Fatalf("want b never served again (8 s), got %+v", r)
	}
	if r.Untyped != 2 {
		t.Fatalf("want 2 untyped errors, got %+v", r)
	}
	b.h.Ops = b.h.Ops[:len(b.h.Ops)-1]
	b.h.Ops = append(b.h.Ops, Op{ID: "b.3", Obj: "b", Start: heal, End: heal + int64(time.Second), OK: true})
	b.h.Lines = append(b.h.Lines, Line{K: LineHandled, T: heal + 1, Proc: "p1", Sys: "s1", Inc: "roam/counter/b@1.1", Obj: "b", Op: "b.3",
		Prev: 1, PH: NextHash(0, "b.1"), N: 2, NH: NextHash(NextHash(0, "b.1"), "b.3")})
	r = Check(b.h)
	if r.NeverServed != 0 || r.UnservedObj != "a" || r.MaxUnserved < int64(3*time.Second) || r.MaxUnserved > int64(4*time.Second) {
		t.Fatalf("want a unserved ~3 s, got %+v", r)
	}
}

func TestObjectID(t *testing.T) {
	for pid, want := range map[string]string{
		"roam/instance_spot/c02@17961.2": "c02",
		"roam/counter/a@b@1.1":           "a@b",
	} {
		if got := objectID(pid); got != want {
			t.Errorf("objectID(%q) = %q, want %q", pid, got, want)
		}
	}
}

func TestSendHeldByAnEntryNodeThatEnded(t *testing.T) {
	// p2 (node "p2") accepts a send for a live object on p1, is cut off,
	// and its lifecycle ends 3 s later: the send failed with it.
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p2", "s2")
	b.h.Lines[1].Node = "p2"
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	t0 := b.tick()
	b.h.Ops = append(b.h.Ops, Op{ID: "a.s", Obj: "a", Send: true, Entry: "p2", Start: t0, End: t0 + 1, OK: true})
	for i := 2; i < 6; i++ {
		b.call("p1", "s1", "roam/counter/a@1.1", "a", fmt.Sprintf("a.%d", i))
	}
	if r := Check(b.h); r.LostAccepted != 1 {
		t.Fatalf("while p2 lives the send is lost accepted: %+v", r)
	}
	b.h.Lines = append(b.h.Lines, Line{K: LineEnded, T: t0 + int64(3*time.Second), Proc: "p2", Node: "p2", Sys: "s2"})
	if r := Check(b.h); r.LostAccepted != 0 || r.LostEndedSends != 1 {
		t.Fatalf("want the send lost with p2's ended lifecycle, got %+v", r)
	}
}

func TestSendDroppedWhileTheObjectServesElsewhereIsLost(t *testing.T) {
	// p3 crashed; a send through p2 is never handled while the object
	// keeps serving on p1: not excused by the crash.
	b := newBuilder()
	b.life("p1", "s1")
	b.life("p3", "s3")
	b.call("p3", "s3", "roam/counter/a@1.1", "a", "a.1")
	b.call("p1", "s1", "roam/counter/a@1.2", "a", "a.2") // moved to p1
	b.h.Killed["p3"] = b.tick()
	b.t += int64(2 * time.Second)
	b.call("p1", "s1", "roam/counter/a@1.2", "a", "a.3")
	b.op("a", "a.4", true, true) // dropped
	b.call("p1", "s1", "roam/counter/a@1.2", "a", "a.5")
	r := Check(b.h)
	if r.LostAccepted != 1 || !hasDetail(r, "lost accepted: op a.4") {
		t.Fatalf("want a.4 lost accepted, got %+v", r)
	}
	// The same send during an outage of the object after the crash (a
	// source forwarding to its crashed target) is lost with the crash.
	b2 := newBuilder()
	b2.life("p1", "s1")
	b2.life("p3", "s3")
	b2.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b2.h.Killed["p3"] = b2.tick()
	b2.t += int64(2 * time.Second)
	b2.op("a", "a.2", true, true)
	b2.t += int64(2 * time.Second)
	b2.call("p1", "s1", "roam/counter/a@1.1", "a", "a.3")
	if r := Check(b2.h); r.LostAccepted != 0 || r.LostEndedSends != 1 {
		t.Fatalf("want a.2 lost with the crash, got %+v", r)
	}
}

func TestStateMovedToANodeThatEndedIsLostWithIt(t *testing.T) {
	// a lives on p1; a move restores it on p2, commits, and p2 is stopped
	// before it handles anything; p2's lease ends and a is reactivated
	// empty on p3. The state's last holder was p2.
	run := func(withRestore bool) Report {
		b := newBuilder()
		b.life("p1", "s1")
		b.life("p2", "s2")
		b.life("p3", "s3")
		b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
		b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.2")
		if withRestore {
			st := b.state["a"]
			b.h.Lines = append(b.h.Lines, Line{K: LineRestored, T: b.tick(), Proc: "p2", Sys: "s2", N: st[0], NH: st[1]})
		}
		b.h.Lines = append(b.h.Lines, Line{K: LineEnded, T: b.tick() + int64(8*time.Second), Proc: "p2", Sys: "s2"})
		b.t += int64(9 * time.Second)
		b.state["a"] = [2]uint64{}
		b.call("p3", "s3", "roam/counter/a@2.1", "a", "a.3")
		return Check(b.h)
	}
	if r := run(true); r.LostAccepted != 0 || r.LostEnded != 2 {
		t.Fatalf("want a.1 and a.2 lost with p2, got %+v", r)
	}
	// Without the move the live p1 held the state: a reactivation while
	// its owner lived lost it.
	if r := run(false); r.LostAccepted != 2 {
		t.Fatalf("want a.1 and a.2 lost accepted, got %+v", r)
	}
}

func TestSendLoggedUndeliveredIsLostLoudly(t *testing.T) {
	b := newBuilder()
	b.life("p1", "s1")
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.1")
	b.op("a", "a.2", true, true)
	b.op("a", "a.3", true, true)
	// roam logged one undelivered send to a: one of the two is loud, the
	// other silent.
	b.h.Lines = append(b.h.Lines, Line{K: LineUndelivered, T: b.tick(), Proc: "p1", Obj: "a", Why: "send_unavailable"})
	b.call("p1", "s1", "roam/counter/a@1.1", "a", "a.4")
	r := Check(b.h)
	if r.LostLogged != 1 || r.LostAccepted != 1 {
		t.Fatalf("want one send lost loudly and one silently, got %+v", r)
	}
}
