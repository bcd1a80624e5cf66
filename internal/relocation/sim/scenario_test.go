package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
)

const ms = time.Millisecond

// scenario builds a scripted world: one object o0 on n1, two clients
// sending to it every 20 ms (every third a request), and a move of o0 from
// n1 to n2 at 50 ms. The hooks inject the fault.
func scenario(seed uint64, cfg Config, hooks Hooks) (*World, *Move) {
	cfg.Objects = 1
	w := NewWorld(cfg, seed, nil)
	w.hooks = hooks
	for i := 0; i < 120; i++ {
		w.scheduleSend(time.Duration(10+20*i)*ms, w.clients[i%2], 0, i%3 == 0, false)
	}
	w.at(50*ms, "move", func() {
		if !w.StartMove(0, w.nodes[1]) {
			panic("scenario: the move did not start")
		}
	})
	return w, nil
}

// run runs a scenario and returns its violations and its one move.
func run(t *testing.T, w *World) ([]Violation, *Move) {
	t.Helper()
	w.SetTracing(true)
	vs := w.Run()
	if len(w.moves) == 0 {
		t.Fatal("no move")
	}
	return vs, w.moves[0]
}

// expectClean fails on any violation, or skips when every violation is an
// instance of an open defect (known.go), which TestOpenDefects reports as
// a failure anyway; a fixed defect that comes back fails here.
func expectClean(t *testing.T, w *World, vs []Violation) {
	t.Helper()
	if len(vs) == 0 {
		return
	}
	var b strings.Builder
	for _, v := range vs {
		b.WriteString("  " + v.String() + "\n")
	}
	if u := Unknown(vs); len(u) == 0 {
		t.Skipf("OPEN DEFECT (TestOpenDefects fails while it is open); this scenario fails:\n%s\ntrace tail:\n%s", b.String(), simkit.Tail(w.Trace(), 40))
	}
	t.Fatalf("violations:\n%s\ntrace tail:\n%s", b.String(), simkit.Tail(w.Trace(), 80))
}

func storeOwner(w *World) string { return w.store.Record(0).OwnerNode }

// A target that crashes between relay-ready and its commit: the source,
// past the cutover, must end up serving again (it fences the move out at
// the target's restore deadline plus a cutover wait, then reinstates). A
// Source that releases its payload at the end of the resend window fails
// it (KnownTargetLoss, fixed).
func TestTargetCrashBetweenRelayReadyAndCommit(t *testing.T) {
	w, _ := scenario(1, DefaultConfig(), Hooks{TargetEffect: func(w *World, tr *TargetRun, e handoff.Effect) {
		if _, ok := e.(handoff.CommitOwner); ok && tr.mv.id == 1 {
			tr.node.crash()
		}
	}})
	vs, mv := run(t, w)
	if !mv.cutoverSent {
		t.Fatal("the scenario did not reach the cutover")
	}
	expectClean(t, w, vs)
	if !mv.reinstated || storeOwner(w) != "n1" {
		t.Fatalf("the source does not serve again: reinstated %v, store names %s\n%s", mv.reinstated, storeOwner(w), simkit.Tail(w.Trace(), 60))
	}
	if w.stats.LostCrash == 0 {
		t.Log("no message was lost with the crashed target")
	}
}

// A lost relay-ready: the target falls back and commits; the source,
// silent until its restore deadline, reconciles, finds the commit and
// adopts the target's route. Then the move must end on both sides.
func TestLostRelayReady(t *testing.T) {
	dropped := false
	w, _ := scenario(2, DefaultConfig(), Hooks{Packet: func(w *World, p *packet) bool {
		if p.kind == pRelayReady && !dropped {
			dropped = true
			return true
		}
		return false
	}})
	vs, mv := run(t, w)
	if !dropped {
		t.Fatal("no relay-ready was sent")
	}
	expectClean(t, w, vs)
	if !mv.opened || storeOwner(w) != "n2" {
		t.Fatalf("the target did not commit: store names %s", storeOwner(w))
	}
}

// The target's first owner CAS applies but is answered indeterminate: the
// retry's read finds this move's commit and the target opens.
func TestIndeterminateCommitApplied(t *testing.T) {
	done := false
	w, _ := scenario(3, DefaultConfig(), Hooks{StoreMode: func(w *World, n *Node, op *storeOp) (storeMode, time.Duration, bool) {
		if op.kind == opCAS && n.name == "n2" && !done {
			done = true
			return modeIndetApplied, 0, true
		}
		return modeOK, 0, false
	}})
	vs, mv := run(t, w)
	expectClean(t, w, vs)
	if !done || !mv.opened || storeOwner(w) != "n2" {
		t.Fatalf("the target did not open on its indeterminate commit: store names %s", storeOwner(w))
	}
}

// The target's first owner CAS does not apply and is answered
// indeterminate: it retries within its deadline and commits.
func TestIndeterminateCommitNotApplied(t *testing.T) {
	done := false
	w, _ := scenario(4, DefaultConfig(), Hooks{StoreMode: func(w *World, n *Node, op *storeOp) (storeMode, time.Duration, bool) {
		if op.kind == opCAS && n.name == "n2" && !done {
			done = true
			return modeIndetNotApplied, 0, true
		}
		return modeOK, 0, false
	}})
	vs, mv := run(t, w)
	expectClean(t, w, vs)
	if !done || !mv.opened || storeOwner(w) != "n2" {
		t.Fatalf("the target did not commit on its retry: store names %s", storeOwner(w))
	}
}

// Every owner CAS of the target is answered indeterminate and none
// applies: the target settles by reading past its deadline and removes
// itself; the source fences the move out and serves again.
func TestIndeterminateCommitNeverApplied(t *testing.T) {
	w, _ := scenario(5, DefaultConfig(), Hooks{StoreMode: func(w *World, n *Node, op *storeOp) (storeMode, time.Duration, bool) {
		if op.kind == opCAS && n.name == "n2" {
			return modeIndetNotApplied, 0, true
		}
		return modeOK, 0, false
	}})
	vs, mv := run(t, w)
	expectClean(t, w, vs)
	if mv.opened || !mv.reinstated || storeOwner(w) != "n1" {
		t.Fatalf("want the source serving again: opened %v reinstated %v store %s", mv.opened, mv.reinstated, storeOwner(w))
	}
}

// The store goes down at the cutover for longer than the restore deadline:
// the target cannot commit and is removed at its deadline; the source
// cannot confirm, then fences the move out once the store answers, and
// serves again.
func TestStoreOutageLongerThanRestoreDeadline(t *testing.T) {
	cfg := DefaultConfig()
	w, _ := scenario(6, cfg, Hooks{SourceEffect: func(w *World, r *SourceRun, e handoff.Effect) {
		if _, ok := e.(handoff.RelayThenCutover); ok && !w.store.down {
			w.store.down = true
			w.tracef("store DOWN (scenario)")
			w.after(cfg.RestoreTimeout+300*ms, "store-up", func() { w.store.down = false; w.tracef("store up") })
		}
	}})
	vs, mv := run(t, w)
	expectClean(t, w, vs)
	if !mv.cutoverSent {
		t.Fatal("the scenario did not reach the cutover")
	}
	if mv.opened == mv.reinstated {
		t.Fatalf("want exactly one end state: opened %v, reinstated %v", mv.opened, mv.reinstated)
	}
}

// The link between source and target is cut right after the cutover, with
// the boundary batch and the cutover in flight: the source learns it
// (ConnectionLost) and resends the whole batch under a new epoch once the
// link is back, within the resend window; nothing accepted is lost.
func TestConnectionLostAfterCutover(t *testing.T) {
	cut := false
	w, _ := scenario(7, DefaultConfig(), Hooks{SourceEffect: func(w *World, r *SourceRun, e handoff.Effect) {
		if _, ok := e.(handoff.RelayThenCutover); ok && !cut {
			cut = true
			w.after(100*time.Microsecond, "cut", func() { w.net.cut(r.node.idx, r.target.idx, true, 20*ms) })
		}
	}})
	vs, mv := run(t, w)
	if !cut {
		t.Fatal("no cutover")
	}
	expectClean(t, w, vs)
	if !mv.opened || storeOwner(w) != "n2" {
		t.Fatalf("the move did not commit: store names %s", storeOwner(w))
	}
}

// lateCommit is the scenario both sabotage tests build on: the target's
// owner CAS is delayed in the store past the source's fence-out decision
// (it applies 800 ms after it was sent, never answered), and the target's
// later reads fail until 900 ms. Run as the driver does, the fence-out's version
// bump makes the late CAS fail and the source serves again.
func lateCommit(cfg Config) *World {
	sent := false
	w, _ := scenario(8, cfg, Hooks{StoreMode: func(w *World, n *Node, op *storeOp) (storeMode, time.Duration, bool) {
		switch {
		case n.name != "n2":
		case op.kind == opCAS && !sent:
			sent = true
			return modeLate, 800 * ms, true
		case op.kind == opRead && sent && w.Now() < 900*ms:
			return modeUnavailable, 0, true
		}
		return modeOK, 0, false
	}})
	return w
}

func TestLateCommitIsFencedOut(t *testing.T) {
	w := lateCommit(DefaultConfig())
	vs, mv := run(t, w)
	expectClean(t, w, vs)
	if !mv.reinstated || storeOwner(w) != "n1" {
		t.Fatalf("want the source serving again after the fence-out: reinstated %v store %s\n%s", mv.reinstated, storeOwner(w), simkit.Tail(w.Trace(), 60))
	}
}

// The checker catches a source that "fences out" without writing the
// fence: the late CAS lands, and the object ends with two serving
// incarnations (or a store naming one that does not serve).
func TestCheckerCatchesSkippedFenceOut(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sabotage = SabotageSkipFenceOut
	w := lateCommit(cfg)
	vs, _ := run(t, w)
	if len(vs) == 0 {
		t.Fatalf("the checker missed a fence-out that was never written\n%s", w.Trace())
	}
	for _, v := range vs {
		t.Logf("caught: %s", v)
	}
	if !hasInvariant(vs, "two-serving") {
		t.Errorf("want two-serving among %v", vs)
	}
}

// The checker catches a target that opens without its commit: the source
// fences the move out and serves again, next to the open target.
func TestCheckerCatchesOpenWithoutCommit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sabotage = SabotageOpenWithoutCommit
	w, _ := scenario(9, cfg, Hooks{})
	vs, _ := run(t, w)
	if !hasInvariant(vs, "two-serving") {
		t.Fatalf("the checker missed a target opened without its commit: %v\n%s", vs, simkit.Tail(w.Trace(), 60))
	}
	// Random schedules catch it too.
	failing := 0
	for seed := uint64(1); seed <= 200; seed++ {
		w := Random(cfg, seed)
		if len(Unknown(w.Run())) > 0 {
			failing++
		}
	}
	if failing == 0 {
		t.Fatal("no random schedule caught a target opened without its commit")
	}
	t.Logf("%d of 200 random schedules caught it", failing)
}

// The checker catches a source that seals without its Session owner's
// seal: the Session ignores the route update of a seal it never made and
// keeps routing to the old owner.
func TestCheckerCatchesASkippedSessionSeal(t *testing.T) {
	cfg := SessionsConfig()
	cfg.Sabotage = SabotageSkipSessionSeal
	caught := 0
	for seed := uint64(1); seed <= 100; seed++ {
		if hasInvariant(Unknown(Random(cfg, seed).Run()), "session-route") {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("no random schedule caught a move that never sealed its Session")
	}
	t.Logf("%d of 100 random schedules caught it", caught)
}

func hasInvariant(vs []Violation, inv string) bool {
	for _, v := range vs {
		if v.Invariant == inv {
			return true
		}
	}
	return false
}

// Seeds the random schedules found, one per protocol defect (the
// defects table, known.go): a fixed defect's seed must run clean, an open
// one's must still show it and nothing else.
func TestKnownDefectSeeds(t *testing.T) {
	defects.CheckSeeds(t, func(seed uint64) string { return replay(seed, false) }, func(seed uint64) ([]Violation, string) {
		r := runSeed(DefaultConfig(), seed, true)
		return r.Violations, r.Trace
	})
}

// Every fixed defect the Source machine can be probed for stays fixed:
// its probe (known.go) finds it absent in the tree, whatever a random
// schedule happens to draw.
func TestFixedDefectsStayFixed(t *testing.T) { defects.CheckFixed(t) }

// An open defect is a failure for as long as it is listed, not a count in
// a log nobody reads.
func TestOpenDefects(t *testing.T) { defects.CheckOpen(t) }
