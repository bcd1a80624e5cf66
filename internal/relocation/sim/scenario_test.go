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

// Seeds the random schedules found, one per protocol defect (the
// defects table, known.go): a fixed defect's seed must run clean, an open
// one's must still show it and nothing else.
func TestKnownDefectSeeds(t *testing.T) {
	defects.CheckSeeds(t, func(seed uint64) string { return replay(seed, DefaultConfig()) }, func(seed uint64) ([]Violation, string) {
		r := runSeed(DefaultConfig(), seed, true)
		return r.Violations, r.Trace
	})
}

// The seeds of BudgetConfig's schedules that showed D11 and D12
// (known.go) run clean.
func TestBudgetDefectSeeds(t *testing.T) {
	for _, seed := range []uint64{42, 45, 79, 657, 1449} {
		if r := runSeed(BudgetConfig(), seed, false); len(r.Violations) > 0 {
			t.Errorf("seed %d (%s): %s", seed, replay(seed, BudgetConfig()), r.Violations[0])
		}
	}
}

// Every fixed defect the Source machine can be probed for stays fixed:
// its probe (known.go) finds it absent in the tree, whatever a random
// schedule happens to draw.
func TestFixedDefectsStayFixed(t *testing.T) { defects.CheckFixed(t) }

// An open defect is a failure for as long as it is listed, not a count in
// a log nobody reads.
func TestOpenDefects(t *testing.T) { defects.CheckOpen(t) }
