package handoff

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// Config holds the hand-off settings the machines use. DefaultConfig gives
// roam's defaults (docs/PROTOCOL.md §9).
type Config struct {
	// ChunkLimit is RelocationPayloadChunkLimit: the largest chunk the
	// source sends. Default 256 KiB.
	ChunkLimit int
	// UnnegotiatedChunkLimit is used when the target announced no receive
	// limit before the seal. Default 32 KiB (PROTOCOL.md §5.6).
	UnnegotiatedChunkLimit int
	// CutoverWaitTimeout is RelocationCutoverWaitTimeout, also the source's
	// resend window. Default 1 s.
	CutoverWaitTimeout time.Duration
	// FollowDuration is MessageFollowDuration. Default 30 s.
	FollowDuration time.Duration
	// BoundaryAckPatience is how long the source resends the boundary
	// batch (every CutoverWaitTimeout) while the target has not
	// acknowledged it. Past it the batch is dropped with a loud error:
	// the target's node is gone or unreachable for that long. Zero means
	// 4×FollowDuration (the default, 120 s).
	BoundaryAckPatience time.Duration
	// StoreRetryBackoff is the pause between CAS attempts. Default 20 ms.
	StoreRetryBackoff time.Duration
	// CreditStep is how many received bytes the target gathers before it
	// credits them back. Default 1: every chunk is credited, so a budget
	// smaller than a chunk still flows.
	CreditStep uint64
	// SealPatience is how long a move of more than one participant waits,
	// from its seal, for every participant's capture: one participant in
	// a long turn must not keep the others sealed. Zero means 5 s; the
	// driver sets half its restore timeout.
	SealPatience time.Duration
	// SessionSealWait is how long a move of Session-bound participants
	// waits for their Session owners to answer the seal request. Past it,
	// the driver drops the bindings of owners whose node is no live
	// member; any other silence ends the move unsealed. Zero means 5 s;
	// the driver sets its capability timeout.
	SessionSealWait time.Duration
}

// DefaultConfig returns roam's defaults (PROTOCOL.md §9).
func DefaultConfig() Config {
	return Config{
		ChunkLimit:             256 << 10,
		UnnegotiatedChunkLimit: 32 << 10,
		CutoverWaitTimeout:     time.Second,
		FollowDuration:         30 * time.Second,
		StoreRetryBackoff:      20 * time.Millisecond,
		CreditStep:             1,
	}
}

// ackPatience is BoundaryAckPatience with its default.
func (c Config) ackPatience() time.Duration {
	if c.BoundaryAckPatience > 0 {
		return c.BoundaryAckPatience
	}
	return 4 * c.FollowDuration
}

// sealPatience is SealPatience with its default.
func (c Config) sealPatience() time.Duration {
	if c.SealPatience > 0 {
		return c.SealPatience
	}
	return 5 * time.Second
}

// sessionSealWait is SessionSealWait with its default.
func (c Config) sessionSealWait() time.Duration {
	if c.SessionSealWait > 0 {
		return c.SessionSealWait
	}
	return 5 * time.Second
}

// AckPatience is how long a source resends an unacknowledged boundary
// batch (BoundaryAckPatience with its default).
func (c Config) AckPatience() time.Duration { return c.ackPatience() }

// Validate rejects settings that cannot work.
func (c Config) Validate() error {
	switch {
	case c.ChunkLimit < 1 || c.UnnegotiatedChunkLimit < 1:
		return fmt.Errorf("%w: chunk limits must be positive", roamerr.ErrInvalidOperation)
	case c.CutoverWaitTimeout <= 0 || c.FollowDuration <= 0 || c.StoreRetryBackoff <= 0 || c.BoundaryAckPatience < 0 || c.SealPatience < 0 || c.SessionSealWait < 0:
		return fmt.Errorf("%w: relocation timeouts must be positive", roamerr.ErrInvalidOperation)
	case c.CreditStep == 0:
		return fmt.Errorf("%w: credit step must be positive", roamerr.ErrInvalidOperation)
	}
	return nil
}
