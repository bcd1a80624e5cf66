// Package spotcall holds the decisions of a call by Spot ID
// (docs/PROTOCOL.md §7.4, §7.5, §7.10): which way a call goes for what
// the route cache or the store named (a delivery to the Ready owner, a
// cold activation, a reactivation, the envelope to the owner finishing an
// activation or close), where a cold activation is placed (the Mesh, the
// stable type, the rendezvous order of the Spot ID), what the
// SpotActivation it sends names, and what each way a call can end means
// to its caller and to the route cache. It does no I/O, so the Spot
// driver (internal/spot) and the deterministic simulation
// (internal/spotsim) decide a call with the same code; each supplies only
// its store, transport and clock.
package spotcall

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Intent is what the caller asked for.
type Intent struct {
	SpotID string
	// Instance: InstanceSpot() was called; a Missing Spot may be
	// cold-activated.
	Instance bool
	// StableType is the one InstanceSpot named, if any.
	StableType string
	// Mesh is the one InMesh named, if any.
	Mesh string
}

// Found is what a resolve found for the Spot ID: its authority (absent
// when Missing) and whether its owner's lifecycle has ended.
type Found struct {
	V     location.Versioned
	Ended bool
}

// Way is how a call reaches its Spot.
type Way int

const (
	// Deliver sends to the Ready owner's incarnation (route kind 1).
	Deliver Way = iota + 1
	// Place cold-activates a Missing Spot on the Mesh's rendezvous
	// target.
	Place
	// Reactivate activates again, on a live node of the stored Mesh with
	// the stored type, a Spot whose owner ended or whose activation was
	// abandoned.
	Reactivate
	// ToOwner sends the SpotActivation to the live owner of a Creating
	// or Closing Spot: it decides, and delivers the first message once.
	ToOwner
)

func (w Way) String() string {
	switch w {
	case Deliver:
		return "deliver"
	case Place:
		return "place"
	case Reactivate:
		return "reactivate"
	case ToOwner:
		return "to owner"
	}
	return fmt.Sprintf("way(%d)", int(w))
}

// Plan is the way a call goes, with where a Place or Reactivate selects
// its target: Mesh ("" the only Mesh any node serves) and StableType (""
// the Mesh's only Instance type).
type Plan struct {
	Way        Way
	Mesh       string
	StableType string
}

// Route decides the way of a call for what its resolve found at now.
// Without Instance intent only a Ready Spot with a live owner is
// reached; with it, a Spot stored as another kind or type is a
// TypeMismatch (PROTOCOL.md §7.5 step 2).
func Route(in Intent, f Found, now time.Time) (Plan, error) {
	rec := f.V.Record
	switch {
	case f.V.Present() && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY && !f.Ended:
		if err := checkExisting(in, f.V); err != nil {
			return Plan{}, err
		}
		return Plan{Way: Deliver}, nil
	case !f.V.Present():
		if !in.Instance {
			return Plan{}, fmt.Errorf("%w: Spot %q has no Ready authority", roamerr.ErrNotFound, in.SpotID)
		}
		return Plan{Way: Place, Mesh: in.Mesh, StableType: in.StableType}, nil
	case f.Ended || activation.Abandoned(rec, now):
		// An Instance Spot whose owner ended (or whose activation was
		// abandoned) is reactivated (PROTOCOL.md §7.10); a User Spot is
		// not.
		if !in.Instance {
			return Plan{}, fmt.Errorf("%w: the owner of Spot %q has ended", roamerr.ErrUnavailable, in.SpotID)
		}
		if err := checkExisting(in, f.V); err != nil {
			return Plan{}, err
		}
		return Plan{Way: Reactivate, Mesh: rec.GetOwner().GetMesh(), StableType: rec.GetStableType()}, nil
	default: // Creating or Closing with a live owner
		if !in.Instance {
			return Plan{}, fmt.Errorf("%w: Spot %q has no Ready authority (%s)", roamerr.ErrNotFound, in.SpotID, rec.GetState())
		}
		if err := checkExisting(in, f.V); err != nil {
			return Plan{}, err
		}
		return Plan{Way: ToOwner, Mesh: rec.GetOwner().GetMesh(), StableType: rec.GetStableType()}, nil
	}
}

// checkExisting: Instance intent to a User Spot, or naming another stable
// type than the stored one, is a TypeMismatch.
func checkExisting(in Intent, v location.Versioned) error {
	if !in.Instance {
		return nil
	}
	r := v.Record
	if v.Key.Kind != location.KindInstanceSpot {
		return fmt.Errorf("%w: Spot %q is a %s, not an Instance Spot", roamerr.ErrTypeMismatch, in.SpotID, r.GetSpotKind())
	}
	if in.StableType != "" && in.StableType != r.GetStableType() {
		return fmt.Errorf("%w: Spot %q has stable type %q, the call names %q", roamerr.ErrTypeMismatch, in.SpotID, r.GetStableType(), in.StableType)
	}
	return nil
}
