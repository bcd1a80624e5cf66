package sim

import "testing"

// The scenarios are scripts: testdata/*.txt, run by TestScripts
// (script_test.go). The tests here sweep random schedules or seeds.

// Random schedules catch a target that opens without its commit, not only
// the scripted one (testdata/sabotage_open_without_commit.txt).
func TestRandomSchedulesCatchOpenWithoutCommit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sabotage = SabotageOpenWithoutCommit
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

// Random schedules catch a source that seals without its Session owner's
// seal (the scripted case: testdata/sabotage_skip_session_seal.txt).
func TestRandomSchedulesCatchASkippedSessionSeal(t *testing.T) {
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

// Seeds the random schedules found, one per protocol defect (see
// known.go). A fixed defect's seed must run clean: a violation there is
// the defect back (or another one), and fails. An open defect's seed must
// still show it (else it is fixed: take it out of open). Seeds are tied
// to the sim's draws: a change of the sim may move them (then search again
// with SIM_SCHEDULES and the known-defect counts the random test prints).
func TestKnownDefectSeeds(t *testing.T) {
	for _, c := range []struct {
		seed   uint64
		defect string
	}{
		{16, KnownAdoptNeverReleases},
		{80, KnownCompleteTwice},
		{396, KnownSettleRace},
		{257, KnownReconcileForever},
		{345, KnownFollowPastStub},
		{528, KnownBatchLost},
		{4161, KnownRedeliveryOrder},
	} {
		t.Run(c.defect[:2], func(t *testing.T) {
			w := Random(DefaultConfig(), c.seed)
			w.SetTracing(true)
			vs := w.Run()
			if !Open(c.defect) {
				if len(vs) > 0 {
					t.Fatalf("seed %d of the fixed defect %q has violations (replay: %s): %v\ntrace tail:\n%s",
						c.seed, c.defect, replay(c.seed, false), vs, tail(w.Trace(), 60))
				}
				return
			}
			if u := Unknown(vs); len(u) > 0 {
				t.Fatalf("seed %d (%s): %v", c.seed, replay(c.seed, false), u)
			}
			for _, v := range vs {
				if v.Known == c.defect {
					return // TestOpenDefects reports it
				}
			}
			t.Errorf("seed %d no longer shows the open defect %q: fixed? take it out of open (known.go)", c.seed, c.defect)
		})
	}
}

// Every fixed defect the Source machine can be probed for stays fixed:
// its probe (known.go) finds it absent in the tree, whatever a random
// schedule happens to draw.
func TestFixedDefectsStayFixed(t *testing.T) {
	for _, d := range []string{KnownTargetLoss, KnownAdoptNeverReleases, KnownCompleteTwice, KnownSettleRace,
		KnownReconcileForever, KnownFollowPastStub, KnownBatchLost, KnownRedeliveryOrder} {
		if !Open(d) && Present(d) {
			t.Errorf("the fixed defect %q is back: the probe of the machine finds it", d)
		}
	}
}

// An open defect is a failure for as long as it is listed, not a count in
// a log nobody reads.
func TestOpenDefects(t *testing.T) {
	for d := range open {
		t.Errorf("OPEN DEFECT in the tree: %q (known.go); its violations are counted, not failed, by the random test", d)
	}
}
