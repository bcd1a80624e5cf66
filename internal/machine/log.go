package machine

import (
	"github.com/rs/zerolog"

	"github.com/roamactors/roam/internal/machine/loglevel"
)

// LogEvent starts the zerolog event of a core's Log effect at its level:
// every driver writes its machine's log lines through it.
func LogEvent(log zerolog.Logger, l loglevel.Level) *zerolog.Event {
	switch l {
	case loglevel.Error:
		return log.Error()
	case loglevel.Warn:
		return log.Warn()
	default:
		return log.Info()
	}
}
