// Package failpoint puts a fixed defect back on demand, for the test that
// must show a checker still finds it. Each Switch is named after the rule
// the defect breaks; production code asks Broken() at the one place the
// fix lives and takes the fixed path when it is false. Off (always, outside
// tests that Break it) the cost is one atomic load.
package failpoint

import "sync/atomic"

// Switch breaks one rule while on.
type Switch struct {
	name string
	on   atomic.Bool
}

// Name is the rule the switch breaks.
func (s *Switch) Name() string { return s.name }

// Broken reports whether the rule is to be broken now.
func (s *Switch) Broken() bool { return s.on.Load() }

// Cleaner is what Break needs of a test: testing.TB.
type Cleaner interface {
	Helper()
	Cleanup(func())
}

// Break breaks the rule until the test ends. The switches are global to
// the process: a test that breaks one must not run in parallel with a test
// that relies on the rule.
func (s *Switch) Break(t Cleaner) {
	t.Helper()
	s.on.Store(true)
	t.Cleanup(func() { s.on.Store(false) })
}

func newSwitch(name string) *Switch { return &Switch{name: name} }

// The rules a switch can break, each where its fix lives.
var (
	// DirectorRoundsOnNodeClock: the placement director's rounds are paced
	// by its node's clock (placement.Env.Clock). Broken, they tick on real
	// time: a node in logical time directs at a rate the clock does not
	// see, and its passes fall behind any bound in logical time.
	DirectorRoundsOnNodeClock = newSwitch("director rounds on the node's clock")
	// StopCancelsRejoin: Stop cancels a rejoin's attempts. Broken, a
	// rejoin's claim runs under a context of its own, and a Stop while the
	// store does not answer waits for it.
	StopCancelsRejoin = newSwitch("Stop cancels a rejoin")
	// RefusedMoveIsTyped: a move refused or failed reports an error of a
	// roamerr class. Broken, the error of a failed move loses its class.
	RefusedMoveIsTyped = newSwitch("a refused move's error is typed")
)
