package spotservice

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// scanStub lists pages from fixed answers and records the recoveries it
// was asked to run; with defer set it answers later, when flush runs the
// pending callbacks, as the simulation's store does.
type scanStub struct {
	pages     map[location.Kind][]location.Page
	listErr   map[location.Kind]error
	failIDs   map[string]bool
	recovered []string
	lists     int
	deferred  bool
	pending   []func()
}

func (s *scanStub) answer(f func()) {
	if s.deferred {
		s.pending = append(s.pending, f)
		return
	}
	f()
}

func (s *scanStub) flush() {
	for len(s.pending) > 0 {
		f := s.pending[0]
		s.pending = s.pending[1:]
		f()
	}
}

func (s *scanStub) List(kind location.Kind, req location.PageRequest, done func(location.Page, error)) {
	s.lists++
	pages := s.pages[kind]
	i := 0
	if req.After != "" {
		fmt.Sscanf(req.After, "p%d", &i)
	}
	var p location.Page
	if i < len(pages) {
		p = pages[i]
	}
	s.answer(func() { done(p, s.listErr[kind]) })
}

func (s *scanStub) Recover(v location.Versioned, done func(error)) {
	s.recovered = append(s.recovered, v.Key.ID)
	var err error
	if s.failIDs[v.Key.ID] {
		err = errors.New("failed " + v.Key.ID)
	}
	s.answer(func() { done(err) })
}

func pointed(kind location.Kind, id string) location.Versioned {
	return location.Versioned{Key: location.Key(kind, id), Record: &location.Record{
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, ActivationRecovery: &messages.ActivationRecovery{}}}
}

func plain(kind location.Kind, id string) location.Versioned {
	return location.Versioned{Key: location.Key(kind, id), Record: &location.Record{State: messages.LifecycleState_LIFECYCLE_STATE_READY}}
}

// The start-up scan walks every page of Instance Spot records, then of
// User Spot records, recovering each record with a recovery pointer in
// the listing's order, one at a time; a failed recovery does not end it,
// a failed listing does. It runs the same whether the host answers at
// once (the driver) or later (the simulation). Reference: docs/PROTOCOL.md §7.7.
func TestRunScanWalksEveryPageInOrder(t *testing.T) {
	pages := map[location.Kind][]location.Page{
		location.KindInstanceSpot: {
			{Items: []location.Versioned{pointed(location.KindInstanceSpot, "a"), plain(location.KindInstanceSpot, "b")}, Next: "p1"},
			{Items: []location.Versioned{pointed(location.KindInstanceSpot, "c")}},
		},
		location.KindUserSpot: {{Items: []location.Versioned{pointed(location.KindUserSpot, "d")}}},
	}
	for _, deferred := range []bool{false, true} {
		stub := &scanStub{pages: pages, failIDs: map[string]bool{"c": true}, deferred: deferred}
		var listErr error
		var failed []error
		ended := 0
		RunScan(stub, func(l error, f []error) { listErr, failed, ended = l, f, ended+1 })
		stub.flush()
		if ended != 1 || listErr != nil || len(failed) != 1 || !slices.Equal(stub.recovered, []string{"a", "c", "d"}) || stub.lists != 3 {
			t.Fatalf("deferred=%v: ended %d times, listErr %v, failed %v, recovered %v in %d listings; want once, nil, [c], [a c d] in 3",
				deferred, ended, listErr, failed, stub.recovered, stub.lists)
		}
	}

	broken := &scanStub{pages: pages, listErr: map[location.Kind]error{location.KindUserSpot: errors.New("down")}}
	var listErr error
	RunScan(broken, func(l error, _ []error) { listErr = l })
	if listErr == nil || !slices.Equal(broken.recovered, []string{"a", "c"}) {
		t.Fatalf("a failed listing: err %v after recovering %v, want an error after [a c]", listErr, broken.recovered)
	}

}
