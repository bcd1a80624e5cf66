package testlog

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// keep is how many of a test's last warnings and errors For keeps.
const keep = 400

// For is the logger of one test's nodes. With ROAM_TEST_LOG set it is
// Logger. Otherwise it keeps the last warnings and errors in memory and
// writes them to t's log only if t failed: a failure seen once under load
// then says what the nodes saw (a fence-out, a reinstate that failed, a
// lease fenced) without a rerun that may not fail again.
func For(t testing.TB) *zerolog.Logger {
	if os.Getenv("ROAM_TEST_LOG") != "" {
		return Logger()
	}
	r := &ring{}
	l := zerolog.New(r).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		lines, dropped := r.snapshot()
		if dropped > 0 {
			t.Logf("nodes' log: %d earlier warnings and errors not kept", dropped)
		}
		for _, line := range lines {
			t.Log("node log: " + line)
		}
	})
	return &l
}

// ring keeps the last keep lines written to it.
type ring struct {
	mu      sync.Mutex
	lines   []string
	dropped int
}

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) == keep {
		r.lines = r.lines[1:]
		r.dropped++
	}
	r.lines = append(r.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (r *ring) snapshot() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...), r.dropped
}
