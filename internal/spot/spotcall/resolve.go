package spotcall

import (
	"errors"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ResolveEnv is what resolving a Spot ID's authority needs from its host:
// the Spot driver answers at once on its goroutine, the simulation when
// its store model answers. Each callback is called exactly once.
type ResolveEnv interface {
	// ReadKeys reads the Instance and the User key of one Spot ID: at
	// once (one round trip to a remote store) or one after the other;
	// each answer is the store's, location.ErrNotFound for an absent key.
	ReadKeys(instance, user location.AuthorityKey, done func(iv location.Versioned, ierr error, uv location.Versioned, uerr error))
	// OwnerNode is the owner's node address and whether its lifecycle
	// still holds its lease (relocation.Driver.OwnerNode, the one liveness
	// rule); err is the store's or the liveness watch's, unclassified.
	OwnerNode(o *messages.Owner, done func(address string, alive bool, err error))
}

// Resolved is what a resolve found for a Spot ID: its authority (absent,
// with the Instance key, when Missing), the owner's address and whether
// the owner's lifecycle has ended (PROTOCOL.md §3.4).
type Resolved struct {
	V       location.Versioned
	Address string
	Ended   bool
}

// Resolve reads a Spot ID's authority: the User and the Instance Spot keys
// share one namespace (PROTOCOL.md §3.1), so the ID is looked up under
// both; at most one exists, because every reservation checks the other
// is absent in the same transaction. A store that cannot answer for the
// Instance key fails the resolve even when the User key answered: the
// Instance record may be the one that exists. An owner found is then
// judged alive or ended. Errors are classified (activation.StoreError).
func Resolve(env ResolveEnv, id string, done func(Resolved, error)) {
	instance, user := location.Key(location.KindInstanceSpot, id), location.Key(location.KindUserSpot, id)
	env.ReadKeys(instance, user, func(iv location.Versioned, ierr error, uv location.Versioned, uerr error) {
		var found Resolved
		switch {
		case ierr == nil:
			found.V = iv
		case !errors.Is(ierr, location.ErrNotFound):
			done(Resolved{}, activation.StoreError("resolve "+instance.String(), ierr))
			return
		case uerr == nil:
			found.V = uv
		case !errors.Is(uerr, location.ErrNotFound):
			done(Resolved{}, activation.StoreError("resolve "+user.String(), uerr))
			return
		default:
			done(Resolved{V: location.Versioned{Key: instance}}, nil)
			return
		}
		env.OwnerNode(found.V.Record.GetOwner(), func(address string, alive bool, err error) {
			if err != nil {
				done(Resolved{}, OwnerError(err))
				return
			}
			found.Address, found.Ended = address, !alive
			done(found, nil)
		})
	})
}

// OwnerError classifies a failure to judge an owner's liveness: an
// indeterminate or unreachable store, or an owner seen gone for less than
// its lease TTL (roamerr.ErrOwnerEnding kept), is Unavailable.
func OwnerError(err error) error { return activation.StoreError("read owner node", err) }

// OwnerAnswer is an owner-liveness look-up's answer (Driver.OwnerNode's
// node address, liveness and error) as every Spot caller takes it: an
// error classed by OwnerError says nothing of liveness.
func OwnerAnswer(address string, alive bool, err error) (string, bool, error) {
	if err != nil {
		return "", false, OwnerError(err)
	}
	return address, alive, nil
}

// OwnerGone reads an owner-liveness answer (err classified by OwnerError)
// as "the owner's lifecycle is over" for a call waiting on it: not alive,
// or its descriptor gone (ErrOwnerEnding: gone for less than the lease
// TTL, which holds back a takeover of its objects, but a call to it may
// only end with its outcome unknown).
func OwnerGone(alive bool, err error) bool {
	return (err == nil && !alive) || errors.Is(err, roamerr.ErrOwnerEnding)
}
