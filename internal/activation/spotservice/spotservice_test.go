package spotservice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// A caller's SpotActivations for one Spot ID are taken in arrival order
// by one worker, which the first push starts and an empty queue ends; other
// IDs have workers of their own.
func TestQueuesOneWorkerPerIDInArrivalOrder(t *testing.T) {
	var q Queues[string, int]
	if !q.Push("a", 1) {
		t.Fatal("the first push for an ID does not start a worker")
	}
	if q.Push("a", 2) {
		t.Fatal("a second push starts a second worker for the same ID")
	}
	if !q.Push("b", 10) {
		t.Fatal("another ID shares the first ID's worker")
	}
	if !q.Working("a") || len(q.Queued("a")) != 2 {
		t.Fatalf("queued for a: working %v, %v", q.Working("a"), q.Queued("a"))
	}
	var got []int
	for {
		v, ok := q.Next("a")
		if !ok {
			break
		}
		got = append(got, v)
		if v == 1 {
			q.Push("a", 3) // arrives while the worker runs: no new worker
		}
	}
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("taken %v, want arrival order [1 2 3]", got)
	}
	if q.Working("a") {
		t.Fatal("the worker of a drained ID still counts as running")
	}
	if !q.Push("a", 4) {
		t.Fatal("a push after the worker ended does not start a new one")
	}
	if v, ok := q.Next("b"); !ok || v != 10 {
		t.Fatalf("b's queue: %v %v", v, ok)
	}
}

// The lock of a Spot ID passes to its waiters first-in-first-out; the
// last release frees it.
func TestLocksHandOverFirstInFirstOut(t *testing.T) {
	var l Locks[int]
	var order []string
	grant := func(who string) func() { return func() { order = append(order, who) } }
	if !l.Acquire(1, grant("first")) {
		t.Fatal("a free lock is not taken at once")
	}
	if !l.Acquire(2, grant("other ID")) {
		t.Fatal("another ID's lock is not independent")
	}
	for _, who := range []string{"second", "third"} {
		if l.Acquire(1, grant(who)) {
			t.Fatalf("%s took a held lock", who)
		}
	}
	if held, waiting := l.Held(1); !held || waiting != 2 {
		t.Fatalf("held %v, %d waiting; want held, 2 waiting", held, waiting)
	}
	if len(order) != 0 {
		t.Fatalf("a waiter was granted before any release: %v", order)
	}
	for range 2 {
		next := l.Release(1)
		if next == nil {
			t.Fatal("a release with waiters frees the lock instead of handing it over")
		}
		next()
		if held, _ := l.Held(1); !held {
			t.Fatal("the lock is free while a granted waiter holds it")
		}
	}
	if !slices.Equal(order, []string{"second", "third"}) {
		t.Fatalf("granted %v, want [second third]", order)
	}
	if next := l.Release(1); next != nil {
		t.Fatal("the last release hands the lock to nobody's grant")
	}
	if held, _ := l.Held(1); held {
		t.Fatal("the lock stays held after its last release")
	}
	if !l.Acquire(1, grant("later")) {
		t.Fatal("a freed lock is not taken at once")
	}
}

func TestLocksReleaseOfAFreeLockPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("releasing a lock nobody holds went unnoticed")
		}
	}()
	var l Locks[string]
	l.Release("x")
}

// All waiters on one key and version share one store watch; its outcome
// reaches all of them: nil when it timed out or the key moved, a typed
// store failure otherwise.
func TestWatchesShareOneStoreWatch(t *testing.T) {
	key := location.Key(location.KindInstanceSpot, "s")
	k := WatchKey{Key: key, After: 7}
	var ws Watches
	var answers []error
	waiter := func(err error) { answers = append(answers, err) }
	if !ws.Join(k, waiter) {
		t.Fatal("the first waiter does not start a store watch")
	}
	if ws.Join(k, waiter) {
		t.Fatal("a second waiter on the same key and version starts another store watch")
	}
	if !ws.Join(WatchKey{Key: key, After: 8}, waiter) {
		t.Fatal("a waiter on another version shares the first one's watch")
	}
	waiters, result := ws.Finish(k, nil, false)
	if len(waiters) != 2 || result != nil {
		t.Fatalf("finish: %d waiters, %v; want 2, nil", len(waiters), result)
	}
	if ws.Running(k) {
		t.Fatal("a finished watch still runs")
	}
	if !ws.Join(k, waiter) {
		t.Fatal("a waiter after the watch finished does not start a new one")
	}
	if _, result := ws.Finish(k, context.DeadlineExceeded, true); result != nil {
		t.Fatalf("a watch that ran out its own timeout answers %v; its waiters should read again (nil)", result)
	}
	ws.Join(k, waiter)
	boom := errors.New("boom")
	_, result = ws.Finish(k, boom, false)
	if !errors.Is(result, roamerr.ErrUnavailable) || !errors.Is(result, boom) {
		t.Fatalf("a failed watch answers %v; want Unavailable wrapping the store's error", result)
	}
}

func TestWaitExpiredIsDeadlineExceeded(t *testing.T) {
	key := location.Key(location.KindUserSpot, "u")
	for _, cause := range []error{nil, context.DeadlineExceeded} {
		err := WaitExpired(key, cause)
		if !errors.Is(err, roamerr.ErrDeadlineExceeded) {
			t.Fatalf("%v is not DeadlineExceeded", err)
		}
		if cause != nil && !errors.Is(err, cause) {
			t.Fatalf("%v lost its cause", err)
		}
	}
}

// A full node passes an activation to the first candidate that has not
// refused it, adding itself to the refusals; the envelope it got is left
// as it was.
func TestPassOnSkipsNodesThatRefused(t *testing.T) {
	full := make([]string, 1, 4) // room to append: a shared backing array would show
	full[0] = "n1"
	a := &messages.SpotActivation{SpotId: "s", FullNodeRids: full, TargetNodeRid: "n2", TargetNodeGeneration: 2}
	before := proto.Clone(a)
	cs := []Candidate{{RID: "n1", Generation: 1}, {RID: "n2", Generation: 2}, {RID: "n3", Generation: 3, DescriptorVersion: 33}, {RID: "n4", Generation: 4}}
	next, i := PassOn(a, "n2", cs)
	if i != 2 {
		t.Fatalf("passed on to candidate %d, want 2 (n3)", i)
	}
	if next.GetTargetNodeRid() != "n3" || next.GetTargetNodeGeneration() != 3 || next.GetDescriptorVersion() != 33 {
		t.Fatalf("envelope targets %s@%d (descriptor %d), want n3@3 (33)", next.GetTargetNodeRid(), next.GetTargetNodeGeneration(), next.GetDescriptorVersion())
	}
	if !slices.Equal(next.GetFullNodeRids(), []string{"n1", "n2"}) {
		t.Fatalf("refusals %v, want [n1 n2]", next.GetFullNodeRids())
	}
	if next.GetSpotId() != "s" {
		t.Fatal("the passed-on envelope lost its Spot ID")
	}
	if !proto.Equal(a, before) || full[:2][1] != "" {
		t.Fatalf("the received envelope changed: %v", a)
	}
	if _, i := PassOn(a, "n2", cs[:2]); i != -1 {
		t.Fatalf("with every candidate refusing, passed on to %d", i)
	}
}

func ready(gen uint64, owner *messages.Owner, state messages.LifecycleState) *location.Record {
	return &location.Record{ObjectGeneration: gen, Owner: owner, State: state}
}

// An own close writes Closing only over this incarnation's Ready record.
func TestClosingOnlyOverOwnReadyRecord(t *testing.T) {
	me := &messages.Owner{Mesh: "m", NodeRid: "n1", NodeGeneration: 1, LeaseId: "L1"}
	other := &messages.Owner{Mesh: "m", NodeRid: "n2", NodeGeneration: 1, LeaseId: "L2"}
	rec := ready(5, me, messages.LifecycleState_LIFECYCLE_STATE_READY)
	c := Closing(rec, 5, me)
	if c.GetState() != messages.LifecycleState_LIFECYCLE_STATE_CLOSING || c.GetObjectGeneration() != 5 || !proto.Equal(c.GetOwner(), me) {
		t.Fatalf("closing record %v", c)
	}
	if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
		t.Fatal("the record read was changed in place")
	}
	for name, r := range map[string]*location.Record{
		"another generation": ready(6, me, messages.LifecycleState_LIFECYCLE_STATE_READY),
		"another owner":      ready(5, other, messages.LifecycleState_LIFECYCLE_STATE_READY),
		"creating":           ready(5, me, messages.LifecycleState_LIFECYCLE_STATE_CREATING),
		"already closing":    ready(5, me, messages.LifecycleState_LIFECYCLE_STATE_CLOSING),
	} {
		if c := Closing(r, 5, me); c != nil {
			t.Errorf("%s: closed anyway: %v", name, c)
		}
	}
}

// A Closing write whose answer never came is settled by what a re-read
// shows, never by a timeout.
func TestSettleClosing(t *testing.T) {
	me := &messages.Owner{Mesh: "m", NodeRid: "n1", NodeGeneration: 1, LeaseId: "L1"}
	other := &messages.Owner{Mesh: "m", NodeRid: "n2", NodeGeneration: 1, LeaseId: "L2"}
	const at location.StoreVersion = 10
	v := func(version location.StoreVersion, gen uint64, o *messages.Owner, st messages.LifecycleState) location.Versioned {
		return location.Versioned{Version: version, Record: ready(gen, o, st)}
	}
	const (
		rdy      = messages.LifecycleState_LIFECYCLE_STATE_READY
		closing  = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
		creating = messages.LifecycleState_LIFECYCLE_STATE_CREATING
	)
	for _, c := range []struct {
		name string
		read location.Versioned
		want Settle
	}{
		{"landed", v(11, 5, me, closing), SettleLanded},
		{"closing at the write's own version", v(at, 5, me, closing), SettleRetry},
		{"ready at the write's version", v(at, 5, me, rdy), SettleFence},
		{"ready past the write's version", v(12, 5, me, rdy), SettleMovedPast},
		{"another generation", v(11, 6, me, closing), SettleChanged},
		{"another owner", v(11, 5, other, closing), SettleChanged},
		{"creating", v(11, 5, me, creating), SettleRetry},
	} {
		if got := SettleClosing(c.read, at, 5, me); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// The start-up scan lists every page of Instance Spot records, then of
// User Spot records, and picks only what needs recovery: a recovery
// pointer, or a User Spot still Creating.
func TestScanWalksBothKindsPageByPage(t *testing.T) {
	withPointer := func(kind location.Kind, id string) location.Versioned {
		return location.Versioned{Key: location.Key(kind, id), Version: 1, Record: &location.Record{
			State: messages.LifecycleState_LIFECYCLE_STATE_READY, ActivationRecovery: &messages.ActivationRecovery{}}}
	}
	plain := func(kind location.Kind, id string, st messages.LifecycleState) location.Versioned {
		return location.Versioned{Key: location.Key(kind, id), Version: 1, Record: &location.Record{State: st}}
	}
	pages := map[location.Kind][]location.Page{
		location.KindInstanceSpot: {
			{Items: []location.Versioned{withPointer(location.KindInstanceSpot, "a"), plain(location.KindInstanceSpot, "b", messages.LifecycleState_LIFECYCLE_STATE_READY)}, Next: "b"},
			{Items: []location.Versioned{withPointer(location.KindInstanceSpot, "c")}},
		},
		location.KindUserSpot: {
			{Items: []location.Versioned{plain(location.KindUserSpot, "u", messages.LifecycleState_LIFECYCLE_STATE_CREATING), plain(location.KindUserSpot, "v", messages.LifecycleState_LIFECYCLE_STATE_READY)}},
		},
	}
	var s Scan
	var asked []string
	var picked []string
	for range 10 {
		kind, req, ok := s.Next()
		if !ok {
			break
		}
		if req.Size != location.MaxPageSize {
			t.Fatalf("page size %d, want %d", req.Size, location.MaxPageSize)
		}
		asked = append(asked, fmt.Sprintf("%v after %q", kind, req.After))
		p := pages[kind][0]
		pages[kind] = pages[kind][1:]
		for _, v := range s.Page(p) {
			picked = append(picked, v.Key.ID)
		}
	}
	want := []string{
		fmt.Sprintf("%v after %q", location.KindInstanceSpot, ""),
		fmt.Sprintf("%v after %q", location.KindInstanceSpot, "b"),
		fmt.Sprintf("%v after %q", location.KindUserSpot, ""),
	}
	if !slices.Equal(asked, want) {
		t.Fatalf("listed %q, want %q", asked, want)
	}
	if !slices.Equal(picked, []string{"a", "c", "u"}) {
		t.Fatalf("picked %v, want [a c u]", picked)
	}
	if _, _, ok := s.Next(); ok {
		t.Fatal("the scan goes on after the last page of the last kind")
	}
}
