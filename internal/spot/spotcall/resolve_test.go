package spotcall

import (
	"errors"
	"fmt"
	"testing"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// resolveStub answers Resolve's reads from fixed answers and records the
// owner it was asked about.
type resolveStub struct {
	iv, uv     location.Versioned
	ierr, uerr error
	alive      bool
	ownerErr   error
	asked      *messages.Owner
}

func (s *resolveStub) ReadKeys(_, _ location.AuthorityKey, done func(location.Versioned, error, location.Versioned, error)) {
	done(s.iv, s.ierr, s.uv, s.uerr)
}

func (s *resolveStub) OwnerNode(o *messages.Owner, done func(string, bool, error)) {
	s.asked = o
	done("addr:"+o.GetNodeRid(), s.alive, s.ownerErr)
}

// A Spot ID is looked up under both kinds' keys (one namespace): the
// Instance record first, the User record when there is no Instance one,
// Missing when neither; a store that cannot answer for a key that may
// hold the record fails the resolve Unavailable; a found owner is judged
// by OwnerNode, and one still ending fails it Unavailable, ErrOwnerEnding.
// Reference: docs/PROTOCOL.md §3.1, §3.4.
func TestResolve(t *testing.T) {
	owner := &messages.Owner{NodeRid: "n2", NodeGeneration: 1, LeaseId: "L"}
	rec := func(kind location.Kind) location.Versioned {
		return location.Versioned{Key: location.Key(kind, "s1"), Version: 4, Record: &location.Record{State: ready, Owner: owner}}
	}
	down := fmt.Errorf("%w: down", location.ErrUnavailable)
	ending := fmt.Errorf("%w: %w: seen gone for 0s", roamerr.ErrUnavailable, roamerr.ErrOwnerEnding)
	for _, tc := range []struct {
		name     string
		stub     resolveStub
		wantKind location.Kind
		present  bool
		ended    bool
		wantErr  error
		askOwner bool
	}{
		{"instance", resolveStub{iv: rec(location.KindInstanceSpot), uerr: location.ErrNotFound, alive: true}, location.KindInstanceSpot, true, false, nil, true},
		{"user", resolveStub{ierr: location.ErrNotFound, uv: rec(location.KindUserSpot), alive: true}, location.KindUserSpot, true, false, nil, true},
		{"missing", resolveStub{ierr: location.ErrNotFound, uerr: location.ErrNotFound}, location.KindInstanceSpot, false, false, nil, false},
		{"instance unreadable", resolveStub{ierr: down, uv: rec(location.KindUserSpot)}, 0, false, false, roamerr.ErrUnavailable, false},
		{"user unreadable", resolveStub{ierr: location.ErrNotFound, uerr: down}, 0, false, false, roamerr.ErrUnavailable, false},
		{"owner ended", resolveStub{iv: rec(location.KindInstanceSpot), uerr: location.ErrNotFound}, location.KindInstanceSpot, true, true, nil, true},
		{"owner ending", resolveStub{iv: rec(location.KindInstanceSpot), uerr: location.ErrNotFound, ownerErr: ending}, 0, false, false, roamerr.ErrOwnerEnding, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := tc.stub
			var got Resolved
			var gotErr error
			calls := 0
			Resolve(&stub, "s1", func(r Resolved, err error) { got, gotErr, calls = r, err, calls+1 })
			if calls != 1 {
				t.Fatalf("done called %d times", calls)
			}
			if (stub.asked != nil) != tc.askOwner {
				t.Fatalf("owner asked: %v, want %v", stub.asked != nil, tc.askOwner)
			}
			if tc.wantErr != nil {
				if !errors.Is(gotErr, tc.wantErr) || !errors.Is(gotErr, roamerr.ErrUnavailable) {
					t.Fatalf("err = %v, want %v (Unavailable)", gotErr, tc.wantErr)
				}
				return
			}
			if gotErr != nil {
				t.Fatalf("err = %v", gotErr)
			}
			if got.V.Key.Kind != tc.wantKind || got.V.Present() != tc.present || got.Ended != tc.ended {
				t.Fatalf("resolved %v present=%v ended=%v, want %v present=%v ended=%v", got.V.Key, got.V.Present(), got.Ended, tc.wantKind, tc.present, tc.ended)
			}
			if tc.present && got.Address != "addr:n2" {
				t.Fatalf("address %q", got.Address)
			}
		})
	}
}

// A call waiting on an owner ends when the owner is not alive, and also
// when its descriptor is gone but not yet for a lease TTL: what was in
// flight to it is lost either way. Any other failure to look says
// nothing. Reference: docs/PROTOCOL.md §3.4.
func TestOwnerGone(t *testing.T) {
	ending := OwnerError(fmt.Errorf("%w: %w: seen gone", roamerr.ErrUnavailable, roamerr.ErrOwnerEnding))
	down := OwnerError(fmt.Errorf("%w: down", location.ErrUnavailable))
	for _, tc := range []struct {
		alive bool
		err   error
		want  bool
	}{{true, nil, false}, {false, nil, true}, {false, ending, true}, {false, down, false}} {
		if got := OwnerGone(tc.alive, tc.err); got != tc.want {
			t.Errorf("OwnerGone(%v, %v) = %v, want %v", tc.alive, tc.err, got, tc.want)
		}
	}
}

// An owner look-up's error says nothing of liveness and is classed as
// every Spot caller classes it; without one, the address and liveness
// stand. Reference: docs/PROTOCOL.md §3.4.
func TestOwnerAnswer(t *testing.T) {
	addr, alive, err := OwnerAnswer("n1:1", true, nil)
	if addr != "n1:1" || !alive || err != nil {
		t.Fatalf("OwnerAnswer(ok) = %q, %v, %v", addr, alive, err)
	}
	addr, alive, err = OwnerAnswer("n1:1", true, fmt.Errorf("read: %w", location.ErrIndeterminate))
	if addr != "" || alive || !errors.Is(err, roamerr.ErrUnavailable) {
		t.Fatalf("OwnerAnswer(indeterminate) = %q, %v, %v: want no address, not alive, Unavailable", addr, alive, err)
	}
}

// A cached route is checked only once its connection ended, and is lost
// only when its owner is gone: a live owner, or a look-up that failed,
// keeps it. Reference: docs/PROTOCOL.md §7.8.
func TestRouteLost(t *testing.T) {
	down := OwnerError(fmt.Errorf("%w: down", location.ErrUnavailable))
	for _, tc := range []struct {
		name   string
		ended  bool
		alive  bool
		err    error
		looked bool
		lost   bool
	}{
		{"connection up", false, false, nil, false, false},
		{"owner alive", true, true, nil, true, false},
		{"owner not alive", true, false, nil, true, true},
		{"owner's descriptor gone", true, false, OwnerError(roamerr.ErrOwnerEnding), true, true},
		{"look-up failed", true, false, down, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			looked, answers := false, 0
			var lost bool
			RouteLost(tc.ended, func(answer func(bool, error)) {
				looked = true
				answer(tc.alive, tc.err)
			}, func(l bool) { lost, answers = l, answers+1 })
			if looked != tc.looked || lost != tc.lost || answers != 1 {
				t.Fatalf("looked %v, lost %v, %d answers: want looked %v, lost %v, one answer", looked, lost, answers, tc.looked, tc.lost)
			}
		})
	}
}
