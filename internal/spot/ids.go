// Package spot addresses Spots by their global Spot ID (docs/PROTOCOL.md
// §7, with the reactivation of PROTOCOL.md §7.10). A node's Manager
// (extension.Spots()) offers:
//
//   - Create(type) and GetOrCreate(id, type) of User Spots: one reservation
//     (Missing → Creating, a CAS that also checks the ID is no Instance
//     Spot), UserSpotCreate to the chosen node, which reads the creation request
//     from the Relocation Store, runs the factory and the Creator callback
//     staged, and commits Ready; a SpotReply answers once per operation.
//     Callers that meet another attempt wait for Ready or Missing.
//   - Request(id, msg) / Send(id, msg) by Spot ID. InstanceSpot(type?)
//     allows cold activation: the caller sends a SpotActivation (route kind 2)
//     with the first message; the target stores it as a recovery root,
//     reserves, runs the factory, commits Ready and dispatches the first
//     message ahead of anything else, and removes the recovery pointer once
//     that handler returned. An Instance Spot whose owner's lifecycle ended
//     is reactivated on a live node the same way (PROTOCOL.md §7.10); an
//     activation whose target died is resumed by Recover (PROTOCOL.md §7.7).
//   - Find, Query (bounded pages), Close of a User Spot (UserSpotClose), and
//     CloseSelf for an Instance Spot from its own handler.
//   - A positive route cache (RouteCacheMaxAge); a Message Follow hint
//     drains the old route with a RouteBarrier before it is dropped, so one
//     node's messages to a Spot keep their order across a move.
//
// Store layout: User and Instance Spots are the authority keys
// user_spot/<id> and instance_spot/<id>; every reservation checks in the
// same transaction that the other key is absent, which makes the Spot ID
// one global namespace. Incarnations are relocatable objects of the
// relocation driver, so Instance Spots move with Relocate.
//
// Proto.Actor grains: IdentityLookup maps the grain (kind, identity) to the
// Instance Spot "<kind>/<identity>" of stable type kind (GrainSpotID).
package spot

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// IsReservedEntryID reports whether id has the reserved Entry Spot format.
func IsReservedEntryID(id string) bool { return meshnode.IsEntrySpotID(id) }

// ValidateID checks a caller-given User or Instance Spot ID: UTF-8, 1..255
// bytes, compared byte for byte, and not in the reserved Entry Spot format.
// Violations are InvalidOperation, before any store write or factory
// (PROTOCOL.md §7.1).
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
// stable name, UTF-8, 1..255 bytes, not normalised (PROTOCOL.md §2.1, §7.1).
func ValidateStableType(stableType string) error {
	if err := location.ValidateID("stable type", stableType); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// NewID issues the Spot ID of a Create: a lowercase canonical UUID v4
// (PROTOCOL.md §7.2).
func NewID() string { return uuid.NewString() }

// opPrefix and opSeq make a call's operation id: 96 random bits drawn once
// per process, and a counter. As unique as a random UUID across nodes and
// restarts, without reading the system's random source on every call
// (a system call, the largest part of a call's own cost).
var (
	opPrefix = func() string {
		b := make([]byte, 12)
		_, _ = rand.Read(b) // crypto/rand never fails on a supported OS
		return hex.EncodeToString(b) + "-"
	}()
	opSeq atomic.Uint64
)

// newOperationID issues a call's operation id (PROTOCOL.md §2.3).
func newOperationID() string {
	var buf [len("0123456789abcdef01234567-") + 13]byte // one allocation: every call makes one
	return string(strconv.AppendUint(append(buf[:0], opPrefix...), opSeq.Add(1), 36))
}

// newID is what Create calls (replaced in tests); newIDCalls counts it.
var (
	newID      = NewID
	newIDCalls atomic.Int64
)

// Route cache and Message Follow defaults (PROTOCOL.md §7.8, §9).
const (
	DefaultRouteCacheMaxAge = 15 * time.Second
	// DefaultRouteCacheMaxRoutes bounds the routes one node caches: past
	// it a new route displaces an arbitrary one, whose next call reads the
	// store (a route only saves that read).
	DefaultRouteCacheMaxRoutes   = 100_000
	DefaultMessageFollowDuration = 30 * time.Second
	// MinFollowMargin is how much longer Message Follow must last than a
	// cached route may live, so a route cached just before a move is still
	// followed when it is used.
	MinFollowMargin = 5 * time.Second
)

// Disabled, as RouteCacheMaxAge, turns the route cache off: every call
// reads the store (PROTOCOL.md §7.8; in Go the zero value means the
// default, so off is spelled Disabled).
//
// Without the cache one caller's order is not kept across a move: no
// route is remembered, so none is drained before the next call goes
// straight to the new owner, and a send still following the old route
// can be handled after the caller's next send or request.
const Disabled time.Duration = -1

// RouteConfig holds the route cache age and the follow duration.
type RouteConfig struct {
	RouteCacheMaxAge      time.Duration
	MessageFollowDuration time.Duration
	// RouteCacheMaxRoutes bounds the routes cached (and as many aged
	// out, kept until their next resolve); default
	// DefaultRouteCacheMaxRoutes.
	RouteCacheMaxRoutes int
}

// WithDefaults fills zero fields with the defaults (PROTOCOL.md §9).
func (c RouteConfig) WithDefaults() RouteConfig {
	if c.RouteCacheMaxAge == 0 {
		c.RouteCacheMaxAge = DefaultRouteCacheMaxAge
	}
	if c.MessageFollowDuration == 0 {
		c.MessageFollowDuration = DefaultMessageFollowDuration
	}
	if c.RouteCacheMaxRoutes == 0 {
		c.RouteCacheMaxRoutes = DefaultRouteCacheMaxRoutes
	}
	return c
}

// Validate rejects a cache age that is not at least MinFollowMargin shorter
// than the follow duration (PROTOCOL.md §7.8).
func (c RouteConfig) Validate() error {
	if c.RouteCacheMaxRoutes < 0 {
		return fmt.Errorf("%w: RouteCacheMaxRoutes %d is negative", roamerr.ErrInvalidOperation, c.RouteCacheMaxRoutes)
	}
	if c.RouteCacheMaxAge == Disabled && c.MessageFollowDuration > 0 {
		return nil
	}
	if c.RouteCacheMaxAge <= 0 || c.MessageFollowDuration <= 0 {
		return fmt.Errorf("%w: route cache age and follow duration must be positive", roamerr.ErrInvalidOperation)
	}
	if c.RouteCacheMaxAge > c.MessageFollowDuration-MinFollowMargin {
		return fmt.Errorf("%w: RouteCacheMaxAge %s must be at least %s shorter than MessageFollowDuration %s",
			roamerr.ErrInvalidOperation, c.RouteCacheMaxAge, MinFollowMargin, c.MessageFollowDuration)
	}
	return nil
}
