package spotsim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/activation"
)

var update = flag.Bool("update", false, "rewrite the golden traces of the scenario tests")

const msd = time.Millisecond

// scenario builds a scripted world without random faults or traffic:
// the Spots are stateless unless a test says otherwise, and nothing is
// probed unless a test asks.
func scenario(seed uint64, hooks Hooks) *World {
	w := NewWorld(DefaultConfig(), seed, nil)
	w.hooks = hooks
	w.SetTracing(true)
	return w
}

// callAt makes client c call Spot s at time at (on its node's current
// lifecycle, which must serve then).
func (w *World) callAt(at time.Duration, c *Client, s *Spot, request bool) {
	w.at(at, func() {
		l := c.node.cur
		if l == nil || !l.usable() {
			panic(fmt.Sprintf("scenario: %s does not serve at %s", c.node.name, ms(at)))
		}
		c.call(l, s, request, false, nil)
	})
}

// golden compares the trace and the violations with testdata/name.golden
// (go test -run name -update rewrites it).
func golden(t *testing.T, w *World, vs []Violation) {
	t.Helper()
	var b strings.Builder
	b.WriteString(w.Trace())
	b.WriteString("\n")
	for _, v := range vs {
		b.WriteString("VIOLATION " + v.String() + "\n")
	}
	got := b.String()
	path := filepath.Join("testdata", t.Name()+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) && i < len(wl); i++ {
			if gl[i] != wl[i] {
				t.Fatalf("trace differs from %s at line %d:\n got: %s\nwant: %s\n(run with -update if the change is intended)", path, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("trace differs from %s in length: %d lines, want %d (run with -update if the change is intended)", path, len(gl), len(wl))
	}
}

func opens(w *World, s *Spot) int {
	n := 0
	for _, l := range w.lives {
		for _, inc := range l.incs {
			if inc.spot == s && inc.openedAt > 0 {
				n++
			}
		}
	}
	return n
}

func handledOnce(t *testing.T, w *World) {
	t.Helper()
	for _, m := range w.msgs {
		if len(m.handled) != 1 {
			t.Errorf("m%d handled %d times", m.id, len(m.handled))
		}
	}
}

// Two callers on two nodes send the first message of one Missing Spot at
// the same instant, each to a different target (as callers with
// different views of the live nodes would): both targets store a root and
// reserve; the store lets one reservation in (create-if-absent), the
// other sees a conflict, deletes its root, reads the authority again and
// forwards its first message, once, to the winner's incarnation (it would
// watch the record first had it still been Creating). One incarnation;
// each message handled once. Reference: docs/PROTOCOL.md §7.5 step 8, §7.6.
func TestScenarioRacingColdActivations(t *testing.T) {
	w := scenario(1, Hooks{Target: func(w *World, c *Client, s *Spot) int { return c.id }})
	s := w.spots[0]
	w.callAt(20*msd, w.clients[0], s, true)
	w.callAt(20*msd, w.clients[1], s, true)
	vs := w.Run()
	golden(t, w, vs)
	if len(vs) > 0 {
		t.Fatalf("violations: %v", vs)
	}
	if n := opens(w, s); n != 1 {
		t.Fatalf("%d incarnations opened, want 1", n)
	}
	handledOnce(t, w)
	if w.stats.Forwarded != 1 || w.stats.Activated != 1 {
		t.Fatalf("activated %d, forwarded %d: want one of each", w.stats.Activated, w.stats.Forwarded)
	}
}

// The reservation applies but its answer is indeterminate: the Write
// machine settles it by a consistent read that finds its own mark (the
// operation in the recovery receipt) and the activation goes on as if
// answered. Reference: PROTOCOL.md §7.5 step 9, §3.3: an indeterminate
// outcome is settled by re-reading, never assumed.
func TestScenarioIndeterminateReserveApplied(t *testing.T) {
	forced := false
	w := scenario(2, Hooks{StoreMode: func(w *World, l *Life, op *storeOp) (storeMode, time.Duration, bool) {
		if op.kind == opApply && strings.HasPrefix(op.why, "reserve") && !forced {
			forced = true
			return modeIndetApplied, 0, true
		}
		return modeOK, 0, false
	}})
	s := w.spots[0]
	w.callAt(20*msd, w.clients[0], s, true)
	vs := w.Run()
	golden(t, w, vs)
	if !forced {
		t.Fatal("no reservation was made")
	}
	if len(vs) > 0 {
		t.Fatalf("violations: %v", vs)
	}
	if n := opens(w, s); n != 1 {
		t.Fatalf("%d incarnations opened, want 1", n)
	}
	handledOnce(t, w)
}

// The owner crashes right after the first message's handler returned,
// before the recovery pointer's removal left it: the Ready record
// keeps its pointer. Once the store ends the crashed lifecycle's lease,
// another caller's call finds an ended owner's record with a pointer and
// resumes it from the recovery root: the first message runs a second
// time, ahead of the new one. The checker marks exactly that repeat as
// the documented repeated first message (Known), and nothing else.
// Reference: PROTOCOL.md §7.7; docs/FAULTS.md "Repeated first message".
func TestScenarioOwnerCrashAfterReady(t *testing.T) {
	s0 := (*Spot)(nil)
	crashed := false
	w := scenario(3, Hooks{Effect: func(w *World, r *Runner, e activation.Effect) {
		// The clear writes over the committed record as soon as the
		// handler returned; the crash comes before that write leaves.
		if _, ok := e.(activation.CompareAndSet); ok && r.label == "clear" && !crashed {
			crashed = true
			w.tracef("%s CRASHES (scenario: right after m1's handler returned)", r.life.node.name)
			r.life.node.crash()
		}
	}})
	s0 = w.spots[0]
	w.callAt(20*msd, w.clients[0], s0, false)
	w.callAt(4*time.Second, w.clients[1], s0, true)
	vs := w.Run()
	golden(t, w, vs)
	if len(Unknown(vs)) > 0 {
		t.Fatalf("violations: %v", Unknown(vs))
	}
	if len(vs) != 1 || vs[0].Known != KnownRepeatedFirst {
		t.Fatalf("want exactly the repeated first message, got %v", vs)
	}
	m1 := w.msgs[0]
	if len(m1.handled) != 2 || m1.handled[1].resumedFrom != m1.op {
		t.Fatalf("m1 handled %d times (second by a resume: %v)", len(m1.handled), len(m1.handled) == 2 && m1.handled[1].resumedFrom == m1.op)
	}
	if w.stats.Resumed != 1 {
		t.Fatalf("resumed %d times, want 1", w.stats.Resumed)
	}
}

// One caller sends twice in a row to a Missing Spot: both calls read
// Missing and send a SpotActivation to the same rendezvous target, whose
// per-ID queue runs them in arrival order: the first activates the Spot
// with its message first, the second finds it Ready and forwards its
// message behind. Handled in the caller's order. Reference:
// PROTOCOL.md §7.5; docs/FAULTS.md "One caller's order to a Missing Spot".
func TestScenarioTwoCallsToMissingSpot(t *testing.T) {
	w := scenario(4, Hooks{})
	s := w.spots[0]
	c := w.clients[0]
	c.plan = []planned{{spot: s, request: false}, {spot: s, request: true}}
	w.at(20*msd, c.issue)
	vs := w.Run()
	golden(t, w, vs)
	if len(vs) > 0 {
		t.Fatalf("violations: %v", vs)
	}
	handledOnce(t, w)
	var order []int
	for _, inc := range w.lives[0].incs {
		for _, m := range inc.handled {
			order = append(order, m.seq)
		}
	}
	for _, l := range w.lives[1:] {
		for _, inc := range l.incs {
			for _, m := range inc.handled {
				order = append(order, m.seq)
			}
		}
	}
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("handled out of order: %v", order)
		}
	}
}

// A caller's two sends in a row, but another caller's activation of the
// Spot is in progress on the target when the first arrives (its Ready
// commit is slow): the first send's envelope waits in the target's per-ID
// queue; the commit lands while the target reads the authority for it
// slowly. The second send would read Ready and go straight to the
// incarnation, ahead of the first; so the first send returns only on its
// dispatch notice, and the second goes after it (the defect known as
// KnownCmd39Overtaken before).
func TestScenarioTwoCallsOvertaken(t *testing.T) {
	committed := false
	w := scenario(5, Hooks{
		StoreMode: func(w *World, l *Life, op *storeOp) (storeMode, time.Duration, bool) {
			switch {
			case op.kind == opApply && strings.HasPrefix(op.why, "cas Ready") && !committed:
				committed = true
				return modeOK, 60 * msd, true
			case committed && l.rid == "n1.1" && strings.HasPrefix(op.why, "authority s1"):
				return modeOK, 20 * msd, true // the target reads slowly from now on
			}
			return modeOK, 0, false
		},
	})
	s := w.spots[0]
	w.callAt(10*msd, w.clients[1], s, false) // another caller activates s1 on n1.1
	var first, second *Call
	w.at(30*msd, func() { // the caller's first send: s1 is Creating
		c := w.clients[2]
		first = c.call(c.node.cur, s, false, false, func() {
			second = c.call(c.node.cur, s, false, false, nil) // its next send, once Do returned
		})
	})
	vs := w.Run()
	golden(t, w, vs)
	if len(vs) > 0 {
		t.Fatalf("violations: %v", vs)
	}
	if first == nil || second == nil || !first.m.viaCmd39 || second.m.viaCmd39 {
		t.Fatalf("want a command 39 followed by a direct send")
	}
	if first.m.handledAt[0] > second.m.handledAt[0] {
		t.Fatalf("the second send was handled first")
	}
}

// The checker catches nodes that do not fence themselves: s1 serves on
// n1, n1 is cut from the store past its lease's TTL, and another caller's
// call after the store ended n1's lease reactivates s1 elsewhere. Run as
// roam runs it, n1 fenced itself first: one serving incarnation; with the
// fence sabotaged, n1 still counts itself the owner: two.
func TestCheckerCatchesNoFence(t *testing.T) {
	for _, sabotage := range []bool{false, true} {
		cfg := DefaultConfig()
		if sabotage {
			cfg.Sabotage = SabotageNoFence
		}
		w := NewWorld(cfg, 6, nil)
		s := w.spots[0]
		w.callAt(20*msd, w.clients[0], s, true)
		w.at(200*msd, func() { w.storeCutFor(w.nodes[0], 5*time.Second) })
		w.callAt(4*time.Second, w.clients[1], s, true)
		vs := w.Run()
		two := 0
		for _, v := range vs {
			if v.Invariant == "two-serving" {
				two++
			}
		}
		switch {
		case !sabotage && len(Unknown(vs)) > 0:
			t.Fatalf("violations as roam runs it: %v", Unknown(vs))
		case sabotage && two == 0:
			t.Fatalf("the checker missed a node serving past its lease: %v", vs)
		}
		if w.stats.Activated+w.stats.Resumed < 2 {
			t.Fatalf("s1 was not reactivated (activated %d, resumed %d)", w.stats.Activated, w.stats.Resumed)
		}
	}
}

// The checker catches a lease revoked before its holder fenced itself:
// n2 revokes n1's lease at its first look instead of after watching n1's
// heartbeat stand still for a TTL, then reactivates s1, while n1 — its
// renewal not yet refused — still serves s1: two. Run as roam runs it, n1
// renews, nobody revokes it, and s1 stays on n1.
func TestCheckerCatchesEarlyRevoke(t *testing.T) {
	for _, sabotage := range []bool{false, true} {
		cfg := DefaultConfig()
		if sabotage {
			cfg.Sabotage = SabotageRevokeEarly
		}
		w := NewWorld(cfg, 7, nil)
		s := w.spots[0]
		w.callAt(20*msd, w.clients[0], s, true)
		w.callAt(350*msd, w.clients[1], s, true)
		w.callAt(500*msd, w.clients[0], s, true)
		w.callAt(600*msd, w.clients[0], s, true)
		vs := w.Run()
		two := 0
		for _, v := range vs {
			if v.Invariant == "two-serving" {
				two++
			}
		}
		switch {
		case !sabotage && len(Unknown(vs)) > 0:
			t.Fatalf("violations as roam runs it: %v", Unknown(vs))
		case !sabotage && w.stats.Activated+w.stats.Resumed != 1:
			t.Fatalf("s1 activated %d times, resumed %d: a live owner was taken over", w.stats.Activated, w.stats.Resumed)
		case sabotage && two == 0:
			t.Fatalf("the checker missed a lease revoked early: %v", vs)
		}
	}
}

// The checker catches SpotActivations run without the per-ID queue and the
// Spot ID's lock: activations of one ID on one node race. (One caller's
// order no longer depends on the queue: a send in a SpotActivation returns on
// its dispatch notice.)
func TestCheckerCatchesNoIDQueue(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sabotage = SabotageNoIDQueue
	caught := map[string]int{}
	for seed := uint64(1); seed <= 2000; seed++ {
		w := Random(cfg, seed)
		for _, v := range Unknown(w.Run()) {
			caught[v.Invariant]++
		}
	}
	if caught["two-serving"]+caught["duplicate"] == 0 {
		t.Fatalf("no random schedule caught the missing per-ID queue and lock: %v", caught)
	}
	t.Logf("caught: %v", caught)
}
