// Package loglevel is the one log vocabulary of roam's machines: how loud
// a core's Log effect is. The pure cores (handoff, activation, session)
// name a level with each event; every driver writes it through
// machine.LogEvent, so a warning of any machine goes out the same way.
// A leaf package, so the cores depend on nothing of the runtime.
package loglevel

// Level is how loud a Log effect is.
type Level int

// The levels: Info for what went as it should, Warn for what the spec
// names a warning (a timeout, a refusal that ends an operation), Error for
// what leaves something for an operator (a record left Closing).
const (
	Info Level = iota
	Warn
	Error
)

func (l Level) String() string {
	switch l {
	case Info:
		return "info"
	case Warn:
		return "warn"
	case Error:
		return "error"
	}
	return "level?"
}
