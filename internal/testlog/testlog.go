// Package testlog gives tests one logger: silent unless ROAM_TEST_LOG names
// a zerolog level (debug, info, warn…), then readable on stderr.
package testlog

import (
	"os"

	"github.com/rs/zerolog"
)

// Logger is the tests' logger.
func Logger() *zerolog.Logger {
	l := zerolog.Nop()
	if lv := os.Getenv("ROAM_TEST_LOG"); lv != "" {
		level, err := zerolog.ParseLevel(lv)
		if err != nil {
			level = zerolog.InfoLevel
		}
		l = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(level).With().Timestamp().Logger()
	}
	return &l
}
