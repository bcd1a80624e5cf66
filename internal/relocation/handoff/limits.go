package handoff

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/redelivery"
	"github.com/roamactors/roam/roamerr"
)

// Limits are a node's hand-off timings, budgets and windows as its driver
// is configured (relocation.Config): zero fields take their defaults, and
// the windows derived from others are derived here (docs/PROTOCOL.md §9).
type Limits struct {
	Handoff Config
	// RestoreTimeout bounds a move from its start (default 10 s); it must
	// exceed the cutover wait, which runs within it.
	RestoreTimeout time.Duration
	// CapabilityTimeout bounds the capability query (default 5 s).
	CapabilityTimeout time.Duration
	// InFlightPayloadBudget is per peer (default 16 MiB), at most half a
	// transport frame, so that the chunks queued for one peer always fit
	// one frame; NodeInFlightPayloadBudget is per node (0: off).
	InFlightPayloadBudget, NodeInFlightPayloadBudget int64
	// ChunkWindow paces chunks within the budget (default 1 MiB, at most
	// the budget).
	ChunkWindow int64
	// ChunkLinkPort: -1 no link, 0 a free port.
	ChunkLinkPort int
	// MaxPayloadLength is the largest payload a target accepts (default
	// 1 GiB).
	MaxPayloadLength uint64
	// RedeliveryWindow (default 10 s), DeadLetterPatience (30 s) and the
	// dead letters' backoff (50 ms doubling to 2 s) pace redelivery.
	RedeliveryWindow, DeadLetterPatience, DeadLetterBackoff, DeadLetterBackoffMax time.Duration
	// SampleEvery stamps one send in SampleEvery (0: off).
	SampleEvery int
}

// Settle gives l's zero fields their defaults and derived values, and
// refuses what is out of range (InvalidOperation); maxFrame is the
// transport's largest frame.
func (l *Limits) Settle(maxFrame int64) error {
	if l.RestoreTimeout < 0 || l.CapabilityTimeout < 0 || l.NodeInFlightPayloadBudget < 0 || l.SampleEvery < 0 {
		return fmt.Errorf("%w: RestoreTimeout (%s), CapabilityTimeout (%s), NodeInFlightPayloadBudget (%d) and SampleEvery (%d) must not be negative",
			roamerr.ErrInvalidOperation, l.RestoreTimeout, l.CapabilityTimeout, l.NodeInFlightPayloadBudget, l.SampleEvery)
	}
	if l.Handoff == (Config{}) {
		l.Handoff = DefaultConfig()
	}
	if err := l.Handoff.Validate(); err != nil {
		return err
	}
	l.RestoreTimeout = or(l.RestoreTimeout, 10*time.Second)
	l.InFlightPayloadBudget = or(l.InFlightPayloadBudget, 16<<20)
	if l.InFlightPayloadBudget < 0 || l.InFlightPayloadBudget > maxFrame/2 {
		return fmt.Errorf("%w: InFlightPayloadBudget %d outside 1..%d", roamerr.ErrInvalidOperation, l.InFlightPayloadBudget, maxFrame/2)
	}
	l.ChunkWindow = or(l.ChunkWindow, min(1<<20, l.InFlightPayloadBudget))
	if l.ChunkWindow < 0 || l.ChunkWindow > l.InFlightPayloadBudget {
		return fmt.Errorf("%w: ChunkWindow %d outside 1..InFlightPayloadBudget (%d)", roamerr.ErrInvalidOperation, l.ChunkWindow, l.InFlightPayloadBudget)
	}
	if l.Handoff.ChunkLimit > 4<<20 {
		return fmt.Errorf("%w: chunk limit %d over 4 MiB", roamerr.ErrInvalidOperation, l.Handoff.ChunkLimit)
	}
	if l.ChunkLinkPort < -1 || l.ChunkLinkPort > 65535 {
		return fmt.Errorf("%w: ChunkLinkPort %d outside -1..65535", roamerr.ErrInvalidOperation, l.ChunkLinkPort)
	}
	l.MaxPayloadLength = or(l.MaxPayloadLength, 1<<30)
	l.CapabilityTimeout = or(l.CapabilityTimeout, 5*time.Second)
	if l.RedeliveryWindow < 0 || l.DeadLetterPatience < 0 || l.DeadLetterBackoff < 0 || l.DeadLetterBackoffMax < 0 {
		return fmt.Errorf("%w: redelivery windows must not be negative", roamerr.ErrInvalidOperation)
	}
	l.RedeliveryWindow = or(l.RedeliveryWindow, redelivery.DefaultWindow)
	l.DeadLetterPatience = or(l.DeadLetterPatience, redelivery.DefaultPatience)
	l.DeadLetterBackoff = or(l.DeadLetterBackoff, redelivery.DefaultBackoff)
	l.DeadLetterBackoffMax = or(l.DeadLetterBackoffMax, redelivery.DefaultBackoffMax)
	// A seal waits at most half the move's time for the turn in progress;
	// a Session owner's seal answer as long as a capability answer.
	l.Handoff.SealPatience = or(l.Handoff.SealPatience, l.RestoreTimeout/2)
	l.Handoff.SessionSealWait = or(l.Handoff.SessionSealWait, l.CapabilityTimeout)
	if l.RestoreTimeout <= l.Handoff.CutoverWaitTimeout {
		return fmt.Errorf("%w: RestoreTimeout %s must exceed the cutover wait %s", roamerr.ErrInvalidOperation, l.RestoreTimeout, l.Handoff.CutoverWaitTimeout)
	}
	return nil
}

// or is v, or def when v is zero.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
