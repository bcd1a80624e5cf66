package admit

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

func query(wantTickets uint32, wantLoad bool, returned ...[]byte) *messages.CapabilityQuery {
	return &messages.CapabilityQuery{Source: &messages.NodeRef{NodeRid: "a", NodeGeneration: 1, Address: "127.0.0.1:1"},
		StableType: "t", ApplicationVersion: "v1", WantTickets: wantTickets, WantLoad: wantLoad, ReturnedTickets: returned}
}

// A supported move gets its ticket and, on a node without capacity, the
// spares asked for (at most MaxTicketsPerAnswer in all); a refused move, a
// drain asking for the load, and a node with capacity get what they get
// below.
func TestAnswerIssuesTheTicketsAMoveMayUse(t *testing.T) {
	now := time.Unix(100, 0)
	const addr = "127.0.0.1:1"
	for _, c := range []struct {
		name       string
		q          *messages.CapabilityQuery
		supported  bool
		capacity   uint32
		move       bool
		spares     int
		sparesHeld int
	}{
		{"one move", query(1, false), true, 0, true, 0, 0},
		{"with spares", query(4, false), true, 0, true, 3, 3},
		{"spares bounded per answer", query(100, false), true, 0, true, MaxTicketsPerAnswer - 1, MaxTicketsPerAnswer - 1},
		{"capacity: no spares", query(4, false), true, 5, true, 0, 0},
		{"refused: none", query(4, false), false, 0, false, 0, 0},
		{"load only: none", query(4, true), true, 0, false, 0, 0},
	} {
		ts := newTestTickets()
		move, spares := ts.Answer(c.q, addr, c.supported, c.capacity, now)
		require.Equal(t, c.move, move != nil, c.name)
		require.Len(t, spares, c.spares, c.name)
		require.Equal(t, c.sparesHeld, ts.Spares(addr), c.name)
		if c.move {
			p := prepareFor(move, "a", 1, addr, "a")
			require.True(t, ts.Take(p, addr, now), "%s: the move's ticket admits it", c.name)
		}
		for _, s := range spares {
			require.True(t, ts.Take(prepareFor(s, "a", 1, addr, "a"), addr, now), "%s: a spare admits a move", c.name)
		}
		require.Zero(t, ts.Spares(addr), "%s: used spares count no more", c.name)
	}
}

// Spare tickets a source gives back count no more, but only its own; past
// MaxSparesPerSource a source gets no more spares.
func TestSpareTicketsAreGivenBackAndBounded(t *testing.T) {
	now := time.Unix(100, 0)
	ts := newTestTickets()
	_, spares := ts.Answer(query(4, false), "127.0.0.1:1", true, 0, now)
	_, theirs := ts.Answer(query(2, false), "127.0.0.1:2", true, 0, now)
	require.Len(t, spares, 3)
	ts.Answer(query(0, true, spares[0], spares[1], theirs[0]), "127.0.0.1:1", true, 0, now)
	require.Equal(t, 1, ts.Spares("127.0.0.1:1"), "two given back")
	require.Equal(t, 1, ts.Spares("127.0.0.1:2"), "another source's ticket stays")
	require.False(t, ts.Take(prepareFor(spares[0], "a", 1, "127.0.0.1:1", "a"), "127.0.0.1:1", now), "given back")

	for ts.IssueSpare("a", 1, "127.0.0.1:3", now) != nil {
	}
	require.Equal(t, MaxSparesPerSource, ts.Spares("127.0.0.1:3"))
}

func target() Target {
	return Target{LeaseValid: true, Registered: true, ApplicationVersion: "v1", Movable: true}
}

// The capability answer refuses a fenced, leaving or full node, and a
// move of an unknown type, another version or a kind that does not move.
func TestCapability(t *testing.T) {
	q := query(1, false)
	require.Equal(t, Verdict{Supported: true}, Capability(target(), q))
	for _, c := range []struct {
		name   string
		change func(*Target)
		reason string
		code   string
	}{
		{"fenced", func(t *Target) { t.LeaseValid = false }, "owner lease", ""},
		{"leaving", func(t *Target) { t.Leaving = true }, "draining", roamerr.CodeNodeDraining},
		{"full", func(t *Target) { t.Capacity, t.Hosting, t.Arriving = 3, 2, 1 }, "capacity 3", roamerr.CodeCapacityExceeded},
		{"unknown type", func(t *Target) { t.Registered = false }, "not registered", ""},
		{"other version", func(t *Target) { t.ApplicationVersion = "v2" }, "application version", ""},
		{"does not move", func(t *Target) { t.Movable = false }, "does not move", ""},
	} {
		tg := target()
		c.change(&tg)
		v := Capability(tg, q)
		require.False(t, v.Supported, c.name)
		require.Contains(t, v.Reason, c.reason, c.name)
		require.Equal(t, c.code, v.Code, c.name)
	}
	tg := target()
	tg.Capacity, tg.Hosting = 3, 2
	require.True(t, Capability(tg, q).Supported, "room for one more")
}

// Only a request's own future gets an answer; the refusal tells a
// non-member from a store that cannot say.
func TestRequestedAndPeerRefusal(t *testing.T) {
	require.True(t, Requested("future$e"))
	require.False(t, Requested("someactor"))
	require.Contains(t, PeerRefusal(true), "not a live member")
	require.Contains(t, PeerRefusal(false), "cannot check")
}

func isEntry(id string) bool { return strings.HasPrefix(id, "entry-") }

// A cross-node Join is admitted only for an Actor into a User Spot this
// node serves at that generation, not moving.
func TestJoin(t *testing.T) {
	actor := location.Key(location.KindActor, "a")
	join := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	serving := Spot{Here: true, Serving: true, Generation: 3}
	require.NoError(t, Join(actor, join, serving, isEntry))
	for _, c := range []struct {
		name string
		key  location.AuthorityKey
		join *messages.Membership
		spot Spot
		want error
	}{
		{"not an Actor", location.Key(location.KindUserSpot, "s"), join, serving, roamerr.ErrInvalidOperation},
		{"an Entry Spot", actor, &messages.Membership{SpotId: "entry-n1", SpotGeneration: 1}, serving, roamerr.ErrInvalidOperation},
		{"arriving", actor, join, Spot{Arriving: true}, roamerr.ErrUnavailable},
		{"not here", actor, join, Spot{}, roamerr.ErrStale},
		{"not serving", actor, join, Spot{Here: true, Generation: 3}, roamerr.ErrStale},
		{"another generation", actor, join, Spot{Here: true, Serving: true, Generation: 4}, roamerr.ErrStale},
		{"moving", actor, join, Spot{Here: true, Serving: true, Generation: 3, Moving: true}, roamerr.ErrUnavailable},
	} {
		require.ErrorIs(t, Join(c.key, c.join, c.spot, isEntry), c.want, c.name)
	}
}

func participant(kind location.Kind, id, stableType, version string) *messages.Participant {
	return &messages.Participant{Object: &messages.ObjectRef{Kind: kind, Id: id, StableType: stableType}, ApplicationVersion: version}
}

// A SpotWide Restore request's members are admitted only into a SpotWide
// User Spot: distinct Actors of a hosted kind at its version, none here.
func TestMembers(t *testing.T) {
	spot := location.Key(location.KindUserSpot, "room")
	kinds := func(st string) MemberKind {
		if st == "t" {
			return MemberKind{Registered: true, ApplicationVersion: "v1"}
		}
		return MemberKind{}
	}
	nobody := func(location.AuthorityKey) bool { return false }
	a, b := participant(location.KindActor, "a", "t", "v1"), participant(location.KindActor, "b", "t", "v1")
	keys, _, err := Members(spot, true, []*messages.Participant{b, a}, 10, kinds, nobody)
	require.NoError(t, err)
	require.Equal(t, []location.AuthorityKey{location.Key(location.KindActor, "b"), location.Key(location.KindActor, "a")}, keys, "in request order")
	keys, _, err = Members(location.Key(location.KindActor, "x"), false, nil, 10, kinds, nobody)
	require.NoError(t, err, "no members: nothing to admit")
	require.Empty(t, keys)

	unsupported, stale := messages.FailureReason_FAILURE_REASON_UNSUPPORTED, messages.FailureReason_FAILURE_REASON_STALE
	for _, c := range []struct {
		name     string
		key      location.AuthorityKey
		spotWide bool
		ps       []*messages.Participant
		here     func(location.AuthorityKey) bool
		reason   messages.FailureReason
		want     error
	}{
		{"not SpotWide", spot, false, []*messages.Participant{a}, nobody, unsupported, roamerr.ErrInvalidOperation},
		{"not a User Spot", location.Key(location.KindActor, "x"), true, []*messages.Participant{a}, nobody, unsupported, roamerr.ErrInvalidOperation},
		{"too many", spot, true, []*messages.Participant{a, b, participant(location.KindActor, "c", "t", "v1")}, nobody, unsupported, roamerr.ErrCapacityExceeded},
		{"twice", spot, true, []*messages.Participant{a, a}, nobody, unsupported, roamerr.ErrInvalidOperation},
		{"not an Actor", spot, true, []*messages.Participant{participant(location.KindUserSpot, "s", "t", "v1")}, nobody, unsupported, roamerr.ErrInvalidOperation},
		{"unknown type", spot, true, []*messages.Participant{participant(location.KindActor, "a", "u", "v1")}, nobody, unsupported, roamerr.ErrNotFound},
		{"other version", spot, true, []*messages.Participant{participant(location.KindActor, "a", "t", "v2")}, nobody, unsupported, roamerr.ErrTypeMismatch},
		{"already here", spot, true, []*messages.Participant{a, b}, func(k location.AuthorityKey) bool { return k.ID == "b" }, stale, roamerr.ErrConflict},
	} {
		keys, reason, err := Members(c.key, c.spotWide, c.ps, 2, kinds, c.here)
		require.ErrorIs(t, err, c.want, c.name)
		require.Equal(t, c.reason, reason, c.name)
		require.Empty(t, keys, c.name)
	}
}

// A SpotWide Spot moves with every member it counts, all serving here and
// none busy, ordered by ID; a member still opening makes the move wait.
func TestSpotWide(t *testing.T) {
	spot := location.Key(location.KindUserSpot, "room")
	m := func(id string) Member { return Member{Key: location.Key(location.KindActor, id)} }
	members, settling, err := SpotWide(spot, 0, 3, []Member{m("c"), m("a"), m("b")}, 10)
	require.NoError(t, err)
	require.Equal(t, -1, settling)
	require.Equal(t, []int{1, 2, 0}, members, "by ID")
	_, _, err = SpotWide(spot, 0, -1, []Member{m("a")}, 10)
	require.NoError(t, err, "count unknown")

	opening := m("b")
	opening.Opening = true
	_, settling, err = SpotWide(spot, 0, 2, []Member{m("a"), opening}, 10)
	require.NoError(t, err)
	require.Equal(t, 1, settling, "wait for b to open")

	busy, disabled := m("b"), m("b")
	busy.Busy, disabled.Disabled = true, true
	for _, c := range []struct {
		name    string
		joining int
		want    int
		cands   []Member
		err     error
	}{
		{"a join on its way", 1, 1, []Member{m("a")}, roamerr.ErrUnavailable},
		{"a member busy", 0, 2, []Member{m("a"), busy}, roamerr.ErrUnavailable},
		{"a member that does not move", 0, 2, []Member{m("a"), disabled}, roamerr.ErrInvalidOperation},
		{"a member elsewhere", 0, 3, []Member{m("a"), m("b")}, roamerr.ErrUnavailable},
		{"too many", 0, 3, []Member{m("a"), m("b"), m("c")}, roamerr.ErrCapacityExceeded},
	} {
		members, settling, err := SpotWide(spot, c.joining, c.want, c.cands, 2)
		require.ErrorIs(t, err, c.err, c.name)
		require.Equal(t, -1, settling, c.name)
		require.Empty(t, members, c.name)
	}
}
