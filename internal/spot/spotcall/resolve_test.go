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
