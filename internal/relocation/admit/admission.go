package admit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Target is what a capability answer judges of the asked node.
type Target struct {
	// LeaseValid: the node's owner lease is in force; Leaving: it is
	// draining or stopping.
	LeaseValid, Leaving bool
	// Capacity bounds the objects it hosts (0: none); Hosting and
	// Arriving are those it serves and those moving in.
	Capacity          uint32
	Hosting, Arriving int
	// Registered: the query's stable type is registered here, at
	// ApplicationVersion. Movable: the query's kind moves at all.
	Registered         bool
	ApplicationVersion string
	Movable            bool
}

// Verdict is a capability answer's: Supported, or why not (Reason, and
// the error code the source reports, if any).
type Verdict struct {
	Supported bool
	Reason    string
	Code      string
}

// Capability judges whether the node t takes the move q asks about: a
// fenced, leaving or full node refuses, and so does one that does not
// host the move's type at its application version, or any move of its
// kind.
func Capability(t Target, q *messages.CapabilityQuery) Verdict {
	switch {
	case !t.LeaseValid:
		return Verdict{Reason: "the node's owner lease is not in force"}
	case t.Leaving:
		return Verdict{Reason: "the node is draining or stopping", Code: roamerr.CodeNodeDraining}
	case t.Capacity > 0 && t.Hosting+t.Arriving >= int(t.Capacity):
		return Verdict{Reason: fmt.Sprintf("the node hosts %d and receives %d of its capacity %d", t.Hosting, t.Arriving, t.Capacity), Code: roamerr.CodeCapacityExceeded}
	case !t.Registered:
		return Verdict{Reason: fmt.Sprintf("stable type %q is not registered here", q.GetStableType())}
	case t.ApplicationVersion != q.GetApplicationVersion():
		return Verdict{Reason: fmt.Sprintf("application version %q, the move carries %q", t.ApplicationVersion, q.GetApplicationVersion())}
	case !t.Movable:
		return Verdict{Reason: fmt.Sprintf("kind %s does not move", q.GetKind())}
	}
	return Verdict{Supported: true}
}

// Requested reports whether a query came as a request, from the PID
// sender (its answer then goes only to the request's own future): an
// answer carrying a ticket never goes to an actor the asker names, which
// would hand it to whoever that actor passes messages to.
func Requested(senderID string) bool { return strings.HasPrefix(senderID, "future") }

// PeerRefusal is the reason a query is refused when checking its asker
// failed: notMember, the store has no such live member at its address;
// otherwise the store could not say. The reason names nothing the asker
// did not send.
func PeerRefusal(notMember bool) string {
	if notMember {
		return "the asking node is not a live member of this mesh at its address"
	}
	return "this node cannot check the asking node in the Location Store now"
}

// Spot is what a Join's admission sees of the User Spot it joins, on the
// target node.
type Spot struct {
	// Here: an incarnation of it is registered on this node; Arriving:
	// none is, but a move of it into this node is under way.
	Here, Arriving bool
	// Serving: the incarnation serves (not staging, leaving or ended), at
	// Generation; Moving: a move of it out is under way.
	Serving    bool
	Generation uint64
	Moving     bool
}

// Join is the target User Spot's admission of a cross-node Join of key
// into join (docs/PROTOCOL.md §7.10), before anything of the move is
// installed: only an Actor joins, and only a User Spot incarnation this
// node serves, at the generation named, not moving. isEntry tells an
// Entry Spot's ID from a User Spot's.
func Join(key location.AuthorityKey, join *messages.Membership, spot Spot, isEntry func(spotID string) bool) error {
	spotKey := location.Key(location.KindUserSpot, join.GetSpotId())
	if key.Kind != location.KindActor || spotKey.Validate() != nil || isEntry(join.GetSpotId()) {
		return fmt.Errorf("%w: only an Actor joins, and only a User Spot", roamerr.ErrInvalidOperation)
	}
	switch {
	case !spot.Here && spot.Arriving:
		return fmt.Errorf("%w: User Spot %q is arriving on this node", roamerr.ErrUnavailable, join.GetSpotId())
	case !spot.Here || !spot.Serving || spot.Generation != join.GetSpotGeneration():
		return fmt.Errorf("%w: User Spot %q is not served on this node at generation %d", roamerr.ErrStale, join.GetSpotId(), join.GetSpotGeneration())
	case spot.Moving:
		return fmt.Errorf("%w: User Spot %q is moving", roamerr.ErrUnavailable, join.GetSpotId())
	}
	return nil
}

// MemberKind is what the target knows of a member's stable type.
type MemberKind struct {
	Registered         bool
	ApplicationVersion string
}

// Members checks the members a SpotWide Restore request for key names
// (ps), before anything of the move is installed: only a SpotWide
// (spotWide) User Spot brings members, at most max, each a distinct Actor
// of a kind this node hosts (kind) at the same application version, none
// of them already here (here). It returns their keys in order, or the
// failure reason to send and the error.
func Members(key location.AuthorityKey, spotWide bool, ps []*messages.Participant, max int,
	kind func(stableType string) MemberKind, here func(location.AuthorityKey) bool) ([]location.AuthorityKey, messages.FailureReason, error) {
	if len(ps) == 0 {
		return nil, 0, nil
	}
	stale := messages.FailureReason_FAILURE_REASON_STALE
	unsupported := messages.FailureReason_FAILURE_REASON_UNSUPPORTED
	switch {
	case key.Kind != location.KindUserSpot || !spotWide:
		return nil, unsupported, fmt.Errorf("%w: only a SpotWide User Spot moves with members", roamerr.ErrInvalidOperation)
	case len(ps) > max:
		return nil, unsupported, fmt.Errorf("%w: %d members, at most %d", roamerr.ErrCapacityExceeded, len(ps), max)
	}
	seen := make(map[location.AuthorityKey]bool, len(ps))
	keys := make([]location.AuthorityKey, 0, len(ps))
	for _, mp := range ps {
		o := mp.GetObject()
		mk := location.Key(o.GetKind(), o.GetId())
		k := kind(o.GetStableType())
		switch {
		case mk.Kind != location.KindActor || mk.Validate() != nil || seen[mk]:
			return nil, unsupported, fmt.Errorf("%w: a member is not a distinct Actor", roamerr.ErrInvalidOperation)
		case !k.Registered:
			return nil, unsupported, fmt.Errorf("%w: member stable type %q not registered here", roamerr.ErrNotFound, o.GetStableType())
		case k.ApplicationVersion != mp.GetApplicationVersion():
			return nil, unsupported, fmt.Errorf("%w: member %s at application version %q, hosting %q", roamerr.ErrTypeMismatch, mk, mp.GetApplicationVersion(), k.ApplicationVersion)
		case here(mk):
			return nil, stale, fmt.Errorf("%w: member %s is already here", roamerr.ErrConflict, mk)
		}
		seen[mk] = true
		keys = append(keys, mk)
	}
	return keys, 0, nil
}

// Member is what a SpotWide move's source sees of one incarnation that
// names the Spot as its User Spot.
type Member struct {
	Key location.AuthorityKey
	// Opening: it arrived with the Spot, whose RelocationReady callback
	// has not returned yet. Busy: it does not serve or is moving,
	// activating or changing its membership. Disabled: its kind has
	// DisableRelocation.
	Opening, Busy, Disabled bool
}

// SpotWide decides which members move with the SpotWide User Spot spot
// (joining: Actors on their way in; want: the members its record counts,
// or -1 when unknown) out of candidates, the incarnations that name it:
// every one counted must serve on this node, none of them moving, at most
// max, and no join on its way. It returns their indexes in candidates,
// ordered by key. settling is the index of a candidate still opening
// (-1: none): the move starts again once its queue is open.
func SpotWide(spot location.AuthorityKey, joining, want int, candidates []Member, max int) (members []int, settling int, err error) {
	if joining > 0 {
		return nil, -1, fmt.Errorf("%w: an Actor is joining User Spot %q", roamerr.ErrUnavailable, spot.ID)
	}
	for i, m := range candidates {
		switch {
		case m.Opening:
			return nil, i, nil
		case m.Busy:
			return nil, -1, fmt.Errorf("%w: member %s of User Spot %q is moving", roamerr.ErrUnavailable, m.Key, spot.ID)
		case m.Disabled:
			return nil, -1, fmt.Errorf("%w: member %s of User Spot %q has DisableRelocation", roamerr.ErrInvalidOperation, m.Key, spot.ID)
		}
		members = append(members, i)
	}
	switch {
	case want >= 0 && len(members) != want:
		return nil, -1, fmt.Errorf("%w: User Spot %q counts %d members, %d of them serve on this node; a SpotWide Spot moves with all of them", roamerr.ErrUnavailable, spot.ID, want, len(members))
	case len(members) > max:
		return nil, -1, fmt.Errorf("%w: User Spot %q has %d members, a SpotWide move takes at most %d", roamerr.ErrCapacityExceeded, spot.ID, len(members), max)
	}
	slices.SortFunc(members, func(a, b int) int { return strings.Compare(candidates[a].Key.ID, candidates[b].Key.ID) })
	return members, -1, nil
}
