// Package spot addresses Spots by their global Spot ID (spec 002). This
// first part holds the identity rules every Spot operation checks before it
// touches the Location Store or runs a factory; the manager, direct calls,
// cold activation and the route cache build on it (issue 4).
package spot

import (
	"fmt"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/roamerr"
)

// reservedEntry matches the framework-issued Entry Spot ID format
// "<diagnostic-prefix>-entry-<lowercase canonical uuid v4>" (spec 002 §2.1).
var reservedEntry = regexp.MustCompile(`^.+-entry-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// IsReservedEntryID reports whether id has the reserved Entry Spot format.
func IsReservedEntryID(id string) bool { return reservedEntry.MatchString(id) }

// ValidateID checks a caller-given User or Instance Spot ID: UTF-8, 1..255
// bytes, compared byte for byte, and not in the reserved Entry Spot format.
// Violations are InvalidOperation, before any store write or factory
// (spec 002 §2, §2.1).
func ValidateID(id string) error {
	if err := location.ValidateID("spot id", id); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	if IsReservedEntryID(id) {
		return fmt.Errorf("%w: spot id %q has the reserved Entry Spot format", roamerr.ErrInvalidOperation, id)
	}
	return nil
}

// ValidateStableType checks a User or Instance Spot type: a case-sensitive
// stable name, UTF-8, 1..255 bytes, not normalised (spec 002 §2).
func ValidateStableType(stableType string) error {
	if err := location.ValidateID("stable type", stableType); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// NewID issues the Spot ID of a Create: a lowercase canonical UUID v4
// (spec 002 §3).
func NewID() string { return uuid.NewString() }

// newID is what Create calls (replaced in tests); newIDCalls counts it.
var (
	newID      = NewID
	newIDCalls atomic.Int64
)

// Route cache and Message Follow defaults (spec 002 §6, DESIGN §5).
const (
	DefaultRouteCacheMaxAge      = 15 * time.Second
	DefaultMessageFollowDuration = 30 * time.Second
	// MinFollowMargin is how much longer Message Follow must last than a
	// cached route may live, so a route cached just before a move is still
	// followed when it is used.
	MinFollowMargin = 5 * time.Second
)

// RouteConfig holds the route cache age and the follow duration.
type RouteConfig struct {
	RouteCacheMaxAge      time.Duration
	MessageFollowDuration time.Duration
}

// WithDefaults fills zero fields with the spec defaults.
func (c RouteConfig) WithDefaults() RouteConfig {
	if c.RouteCacheMaxAge == 0 {
		c.RouteCacheMaxAge = DefaultRouteCacheMaxAge
	}
	if c.MessageFollowDuration == 0 {
		c.MessageFollowDuration = DefaultMessageFollowDuration
	}
	return c
}

// Validate rejects a cache age that is not at least MinFollowMargin shorter
// than the follow duration (spec 002 §6).
func (c RouteConfig) Validate() error {
	if c.RouteCacheMaxAge <= 0 || c.MessageFollowDuration <= 0 {
		return fmt.Errorf("%w: route cache age and follow duration must be positive", roamerr.ErrInvalidOperation)
	}
	if c.RouteCacheMaxAge > c.MessageFollowDuration-MinFollowMargin {
		return fmt.Errorf("%w: RouteCacheMaxAge %s must be at least %s shorter than MessageFollowDuration %s",
			roamerr.ErrInvalidOperation, c.RouteCacheMaxAge, MinFollowMargin, c.MessageFollowDuration)
	}
	return nil
}
