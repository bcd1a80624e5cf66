package handoff_test

import (
	"errors"
	"testing"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

func admissible() handoff.PrepareFacts {
	return handoff.PrepareFacts{LeaseValid: true, IdentityValid: true, FromSource: true, Ticket: func() bool { return true },
		Movable: true, Registered: true}
}

// A Restore request is refused for the first check that fails, in the
// order fenced, leaving, identity, sender, ticket, kind, registration,
// Join and members, each with its reason; a ticket is taken, and a Join
// admitted, only once every check before it passed.
// Reference: PROTOCOL.md §5.7
func TestAdmitPrepareRefusesInOrder(t *testing.T) {
	const (
		stale       = messages.FailureReason_FAILURE_REASON_STALE
		draining    = messages.FailureReason_FAILURE_REASON_NODE_DRAINING
		conflict    = messages.FailureReason_FAILURE_REASON_CONFLICT
		unsupported = messages.FailureReason_FAILURE_REASON_UNSUPPORTED
	)
	for _, tc := range []struct {
		name   string
		change func(*handoff.PrepareFacts)
		reason messages.FailureReason
	}{
		{"fenced and leaving", func(f *handoff.PrepareFacts) { f.LeaseValid, f.Leaving = false, true }, stale},
		{"leaving with a bad identity", func(f *handoff.PrepareFacts) { f.Leaving, f.IdentityValid = true, false }, draining},
		{"bad identity from another node", func(f *handoff.PrepareFacts) { f.IdentityValid, f.FromSource = false, false }, conflict},
		{"from another node, no ticket", func(f *handoff.PrepareFacts) {
			f.FromSource, f.Ticket = false, func() bool { t.Error("ticket taken for a request not from its source"); return false }
		}, conflict},
		{"no ticket, not movable", func(f *handoff.PrepareFacts) { f.Ticket, f.Movable = func() bool { return false }, false }, stale},
		{"not movable, not registered", func(f *handoff.PrepareFacts) { f.Movable, f.Registered = false, false }, unsupported},
		{"not registered, Join refused", func(f *handoff.PrepareFacts) {
			f.Registered = false
			f.Admit = func() (messages.FailureReason, error) {
				t.Error("Join admitted for an unregistered type")
				return stale, errors.New("x")
			}
		}, unsupported},
		{"Join refused", func(f *handoff.PrepareFacts) {
			f.Admit = func() (messages.FailureReason, error) { return conflict, errors.New("members") }
			f.Earlier = handoff.TargetRestoring
		}, conflict},
		{"earlier arrival past relay-ready", func(f *handoff.PrepareFacts) { f.Earlier = handoff.RelayReady }, stale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := admissible()
			tc.change(&f)
			v := handoff.AdmitPrepare(f)
			if !v.Refuse || v.Reason != tc.reason || v.Supersede {
				t.Fatalf("verdict %+v, want a refusal with %s", v, tc.reason)
			}
		})
	}
}

// A request admitted while an earlier arrival of the object still
// restores supersedes it: newest prepare wins.
// Reference: PROTOCOL.md §5.7
func TestAdmitPrepareSupersedesRestoring(t *testing.T) {
	f := admissible()
	if v := handoff.AdmitPrepare(f); v.Refuse || v.Supersede {
		t.Fatalf("no earlier arrival: %+v, want accepted", v)
	}
	f.Earlier = handoff.TargetRestoring
	if v := handoff.AdmitPrepare(f); v.Refuse || !v.Supersede {
		t.Fatalf("earlier arrival restoring: %+v, want it superseded", v)
	}
	f.Ticket = func() bool { return false }
	if v := handoff.AdmitPrepare(f); !v.Refuse || !v.NoTicket || v.Supersede {
		t.Fatalf("no ticket: %+v, want refused as not entitled, nothing superseded", v)
	}
}

// A move is refused for its node's lease first, then for its object, each
// with its error class.
func TestRefuseStartInOrder(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	lease := errors.New("lease")
	for _, tc := range []struct {
		name string
		f    handoff.StartFacts
		want error
	}{
		{"lease ended", handoff.StartFacts{Lease: lease, TargetIsSelf: true}, lease},
		{"not owned", handoff.StartFacts{TargetIsSelf: true}, roamerr.ErrNotFound},
		{"not serving", handoff.StartFacts{Owned: true, TargetIsSelf: true}, roamerr.ErrUnavailable},
		{"moving", handoff.StartFacts{Owned: true, Serving: true, Moving: true, TargetIsSelf: true}, roamerr.ErrUnavailable},
		{"to itself", handoff.StartFacts{Owned: true, Serving: true, TargetIsSelf: true, Changing: true}, roamerr.ErrInvalidOperation},
		{"changing", handoff.StartFacts{Owned: true, Serving: true, Changing: true, SpotWideSpot: "crew"}, roamerr.ErrUnavailable},
		{"a SpotWide member alone", handoff.StartFacts{Owned: true, Serving: true, SpotWideSpot: "crew"}, roamerr.ErrInvalidOperation},
		{"admitted", handoff.StartFacts{Owned: true, Serving: true}, nil},
	} {
		err := handoff.RefuseStart(tc.f, key, "n2")
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want none", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// A control message belongs to a run by its identity and the node it came
// from only: another identity is another run's; the run's identity from
// another node, or from no node, is refused.
// Reference: PROTOCOL.md §5.7
func TestAttributeByIdentityAndConnection(t *testing.T) {
	id := handoff.Identity{RelocationID: 3, TargetAttemptGeneration: 1, Fence: handoff.Fence{NodeRid: "a", NodeGeneration: 1, OwnerGeneration: 2}}
	other := id
	other.TargetAttemptGeneration = 2
	for _, tc := range []struct {
		got  handoff.Identity
		from string
		want handoff.Attribution
	}{
		{id, "b:1", handoff.ThisRun},
		{other, "b:1", handoff.OtherRun},
		{id, "c:1", handoff.WrongPeer},
		{id, "", handoff.WrongPeer},
	} {
		if got := handoff.Attribute(id, "b:1", tc.got, tc.from); got != tc.want {
			t.Errorf("attempt %d from %q: %d, want %d", tc.got.TargetAttemptGeneration, tc.from, got, tc.want)
		}
	}
	if got := handoff.Attribute(id, "", id, ""); got != handoff.WrongPeer {
		t.Errorf("no sender, no peer address: %d, want refused", got)
	}
}
