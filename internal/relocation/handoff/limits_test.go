package handoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/roamerr"
)

const frame = 64 << 20

// Zero limits take their defaults, and the windows derived from others
// follow them.
func TestLimitsDefaults(t *testing.T) {
	var l Limits
	require.NoError(t, l.Settle(frame))
	def := DefaultConfig()
	def.SealPatience, def.SessionSealWait = 5*time.Second, 5*time.Second
	require.Equal(t, Limits{
		Handoff: def, RestoreTimeout: 10 * time.Second, CapabilityTimeout: 5 * time.Second,
		InFlightPayloadBudget: 16 << 20, ChunkWindow: 1 << 20, MaxPayloadLength: 1 << 30,
		RedeliveryWindow: 10 * time.Second, DeadLetterPatience: 30 * time.Second,
		DeadLetterBackoff: 50 * time.Millisecond, DeadLetterBackoffMax: 2 * time.Second,
	}, l)

	// Derived from what is set; what is set stays.
	l = Limits{RestoreTimeout: 4 * time.Second, CapabilityTimeout: time.Second, InFlightPayloadBudget: 1 << 19, ChunkLinkPort: -1}
	require.NoError(t, l.Settle(frame))
	require.Equal(t, 2*time.Second, l.Handoff.SealPatience, "half the restore timeout")
	require.Equal(t, time.Second, l.Handoff.SessionSealWait, "the capability timeout")
	require.Equal(t, int64(1<<19), l.ChunkWindow, "at most the budget")
	require.Equal(t, -1, l.ChunkLinkPort)

	h := DefaultConfig()
	h.SealPatience, h.SessionSealWait = time.Second, 3*time.Second
	l = Limits{Handoff: h}
	require.NoError(t, l.Settle(frame))
	require.Equal(t, time.Second, l.Handoff.SealPatience)
	require.Equal(t, 3*time.Second, l.Handoff.SessionSealWait)
}

// Out of range is InvalidOperation.
func TestLimitsRefused(t *testing.T) {
	slowCutover := DefaultConfig()
	slowCutover.CutoverWaitTimeout = 10 * time.Second
	bigChunks := DefaultConfig()
	bigChunks.ChunkLimit = 4<<20 + 1
	badHandoff := DefaultConfig()
	badHandoff.CreditStep = 0
	for _, c := range []struct {
		name string
		l    Limits
	}{
		{"negative restore timeout", Limits{RestoreTimeout: -1}},
		{"negative capability timeout", Limits{CapabilityTimeout: -1}},
		{"negative node budget", Limits{NodeInFlightPayloadBudget: -1}},
		{"negative sampling", Limits{SampleEvery: -1}},
		{"negative budget", Limits{InFlightPayloadBudget: -1}},
		{"budget over half a frame", Limits{InFlightPayloadBudget: frame/2 + 1}},
		{"window over the budget", Limits{InFlightPayloadBudget: 1 << 20, ChunkWindow: 1<<20 + 1}},
		{"negative window", Limits{ChunkWindow: -1}},
		{"chunks over 4 MiB", Limits{Handoff: bigChunks}},
		{"link port", Limits{ChunkLinkPort: -2}},
		{"link port too high", Limits{ChunkLinkPort: 65536}},
		{"negative redelivery window", Limits{RedeliveryWindow: -1}},
		{"negative patience", Limits{DeadLetterPatience: -1}},
		{"negative backoff", Limits{DeadLetterBackoff: -1}},
		{"negative backoff max", Limits{DeadLetterBackoffMax: -1}},
		{"restore within the cutover wait", Limits{Handoff: slowCutover}},
		{"restore timeout at the default cutover wait", Limits{RestoreTimeout: time.Second}},
		{"an invalid hand-off config", Limits{Handoff: badHandoff}},
	} {
		l := c.l
		require.ErrorIs(t, l.Settle(frame), roamerr.ErrInvalidOperation, c.name)
	}
	l := Limits{InFlightPayloadBudget: frame / 2, RestoreTimeout: time.Second + 1}
	require.NoError(t, l.Settle(frame), "the bounds themselves are allowed")
}
