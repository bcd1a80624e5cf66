package spotcall

import (
	"errors"
	"testing"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var now = time.Unix(1_000_000, 0)

func found(kind location.Kind, state messages.LifecycleState, ended bool) Found {
	return Found{V: location.Versioned{Key: location.Key(kind, "s1"), Version: 3, Record: &location.Record{
		State: state, StableType: "counter",
		Owner: &messages.Owner{Mesh: "m1", NodeRid: "n1", NodeGeneration: 7},
	}}, Ended: ended}
}

const (
	ready    = messages.LifecycleState_LIFECYCLE_STATE_READY
	creating = messages.LifecycleState_LIFECYCLE_STATE_CREATING
	closing  = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
)

// TestRoute: the way of a call for each authority a resolve can find,
// with and without Instance intent. Reference: docs/PROTOCOL.md §7.4,
// §7.5, §7.10.
func TestRoute(t *testing.T) {
	inst := Intent{SpotID: "s1", Instance: true}
	plain := Intent{SpotID: "s1"}
	abandoned := found(location.KindInstanceSpot, creating, false)
	abandoned.V.Record.ActivationRecovery = &messages.ActivationRecovery{DeadlineUnixNanos: now.Add(-activation.AbandonGrace - time.Second).UnixNano()}
	for _, tc := range []struct {
		name string
		in   Intent
		f    Found
		want Plan
		err  error
	}{
		{"ready", plain, found(location.KindUserSpot, ready, false), Plan{Way: Deliver}, nil},
		{"ready instance", inst, found(location.KindInstanceSpot, ready, false), Plan{Way: Deliver}, nil},
		{"missing", plain, Found{V: location.Versioned{Key: location.Key(location.KindInstanceSpot, "s1")}}, Plan{}, roamerr.ErrNotFound},
		{"missing instance", Intent{SpotID: "s1", Instance: true, Mesh: "m2", StableType: "t"}, Found{V: location.Versioned{Key: location.Key(location.KindInstanceSpot, "s1")}}, Plan{Way: Place, Mesh: "m2", StableType: "t"}, nil},
		{"ended", plain, found(location.KindUserSpot, ready, true), Plan{}, roamerr.ErrUnavailable},
		{"ended instance", inst, found(location.KindInstanceSpot, ready, true), Plan{Way: Reactivate, Mesh: "m1", StableType: "counter"}, nil},
		{"abandoned instance", inst, abandoned, Plan{Way: Reactivate, Mesh: "m1", StableType: "counter"}, nil},
		{"creating", plain, found(location.KindUserSpot, creating, false), Plan{}, roamerr.ErrNotFound},
		{"creating instance", inst, found(location.KindInstanceSpot, creating, false), Plan{Way: ToOwner, Mesh: "m1", StableType: "counter"}, nil},
		{"closing instance", inst, found(location.KindInstanceSpot, closing, false), Plan{Way: ToOwner, Mesh: "m1", StableType: "counter"}, nil},
		{"user spot, instance intent", inst, found(location.KindUserSpot, ready, false), Plan{}, roamerr.ErrTypeMismatch},
		{"other type", Intent{SpotID: "s1", Instance: true, StableType: "other"}, found(location.KindInstanceSpot, ready, false), Plan{}, roamerr.ErrTypeMismatch},
		{"other type, ended", Intent{SpotID: "s1", Instance: true, StableType: "other"}, found(location.KindInstanceSpot, ready, true), Plan{}, roamerr.ErrTypeMismatch},
		{"other type, creating", Intent{SpotID: "s1", Instance: true, StableType: "other"}, found(location.KindInstanceSpot, creating, false), Plan{}, roamerr.ErrTypeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Route(tc.in, tc.f, now)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if p != tc.want {
				t.Fatalf("plan %+v, want %+v", p, tc.want)
			}
		})
	}
}

func node(rid, mesh string, weight uint32, status messages.NodeStatus, types ...string) location.VersionedNode {
	return location.VersionedNode{Version: 5, Node: &location.NodeDescriptor{
		NodeRid: rid, NodeGeneration: 2, Mesh: mesh, Weight: weight, Status: status, InstanceTypes: types,
	}}
}

const serving = messages.NodeStatus_NODE_STATUS_SERVING

// TestTarget: where a cold activation or reactivation goes, and how a
// placement that finds nowhere fails. Reactivation's failures are
// transient. Reference: docs/PROTOCOL.md §7.5 steps 4–7, §7.10.
func TestTarget(t *testing.T) {
	nodes := []location.VersionedNode{
		node("n1", "m1", 1, serving, "counter"),
		node("n2", "m1", 1, serving, "counter"),
		node("n3", "m1", 1, messages.NodeStatus_NODE_STATUS_DRAINING, "counter"),
		node("n4", "m1", 1, serving, "other"),
	}
	first := Candidates(nodes, "counter", true, "s1")[0]
	got, act, err := Target(Plan{Way: Place, StableType: "counter"}, "s1", nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node.GetNodeRid() != first.Node.GetNodeRid() || act.GetTargetNodeRid() != first.Node.GetNodeRid() ||
		act.GetTargetMesh() != "m1" || act.GetTargetNodeGeneration() != 2 || act.GetDescriptorVersion() != 5 || !act.GetSourceReadMissing() {
		t.Fatalf("target %s, envelope %v", got.Node.GetNodeRid(), act)
	}
	if _, act, err = Target(Plan{Way: Reactivate, Mesh: "m1", StableType: "counter"}, "s1", nodes, nil); err != nil || act.GetSourceReadMissing() || act.GetStableType() != "counter" {
		t.Fatalf("reactivation: %v, %v", act, err)
	}
	for _, tc := range []struct {
		name  string
		p     Plan
		nodes []location.VersionedNode
		err   error
		want  error
	}{
		{"no mesh", Plan{Way: Place}, nil, nil, roamerr.ErrNotConfigured},
		{"two meshes", Plan{Way: Place, StableType: "counter"}, append(nodes, node("n9", "m2", 1, serving, "counter")), nil, roamerr.ErrInvalidOperation},
		{"named mesh empty", Plan{Way: Place, Mesh: "m3"}, nil, nil, roamerr.ErrNotFound},
		{"stored mesh empty", Plan{Way: Reactivate, Mesh: "m3", StableType: "counter"}, nil, nil, roamerr.ErrUnavailable},
		{"type nobody hosts", Plan{Way: Place, StableType: "x"}, nodes, nil, roamerr.ErrNotFound},
		{"stored type nobody hosts", Plan{Way: Reactivate, Mesh: "m1", StableType: "x"}, nodes, nil, roamerr.ErrUnavailable},
		{"two types", Plan{Way: Place}, nodes, nil, roamerr.ErrInvalidOperation},
		{"only a draining node hosts it", Plan{Way: Place, StableType: "counter"}, nodes[2:3], nil, roamerr.ErrUnavailable},
		{"listing failed", Plan{Way: Place}, nil, location.ErrUnavailable, roamerr.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Target(tc.p, "s1", tc.nodes, tc.err); !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

// TestCandidatesRendezvous: the order of one Spot ID's targets does not
// depend on the listing's order, skips nodes that do not serve or host
// the type, and follows the weights.
func TestCandidatesRendezvous(t *testing.T) {
	var nodes []location.VersionedNode
	for _, rid := range []string{"a", "b", "c", "d", "e"} {
		nodes = append(nodes, node(rid, "m", 1, serving, "t"))
	}
	nodes = append(nodes, node("f", "m", 1, messages.NodeStatus_NODE_STATUS_DRAINING, "t"), node("g", "m", 1, serving, "u"))
	order := func(ns []location.VersionedNode, id string) (s string) {
		for _, n := range Candidates(ns, "t", true, id) {
			s += n.Node.GetNodeRid()
		}
		return s
	}
	reversed := make([]location.VersionedNode, len(nodes))
	for i, n := range nodes {
		reversed[len(nodes)-1-i] = n
	}
	firsts := map[byte]int{}
	for i := range 200 {
		id := "s" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		o := order(nodes, id)
		if len(o) != 5 || o != order(reversed, id) {
			t.Fatalf("%s: order %q, reversed %q", id, o, order(reversed, id))
		}
		firsts[o[0]]++
	}
	if len(firsts) < 5 {
		t.Fatalf("first targets %v: the IDs do not spread", firsts)
	}
	heavy := append([]location.VersionedNode{node("h", "m", 1000, serving, "t")}, nodes...)
	for i := range 20 {
		if o := order(heavy, "w"+string(rune('a'+i))); o[0] != 'h' {
			t.Fatalf("weight 1000 among weight 1 is first in %q", o)
		}
	}
}

// TestEnded: what each way a call's wait ends means to its caller (its
// class) and to the route cache. Reference: docs/PROTOCOL.md §7.4.
func TestEnded(t *testing.T) {
	for _, tc := range []struct {
		e      End
		notice bool
		want   error
		drop   bool
	}{
		{DeadLetter, false, roamerr.ErrStale, true},
		{TimedOut, false, roamerr.ErrDeadlineExceeded, false},
		{TimedOut, true, roamerr.ErrDeadlineExceeded, false},
		{Cancelled, false, roamerr.ErrDeadlineExceeded, false},
		{ConnectionLost, false, roamerr.ErrUnavailable, true},
		{OwnerLeft, true, roamerr.ErrUnavailable, true},
	} {
		err, drop := Ended("s1", tc.e, tc.notice, "n2", errors.New("cancelled"))
		if !errors.Is(err, tc.want) || drop != tc.drop {
			t.Errorf("%d (notice %v): %v, drop %v; want %v, drop %v", tc.e, tc.notice, err, drop, tc.want, tc.drop)
		}
	}
	if a, _ := Ended("s1", TimedOut, true, "", nil); a.Error() == func() string { b, _ := Ended("s1", TimedOut, false, "", nil); return b.Error() }() {
		t.Errorf("a send's unconfirmed dispatch reads as a lost reply: %v", a)
	}
	for _, tc := range []struct {
		err  error
		drop bool
	}{
		{roamerr.ErrStale, true}, {roamerr.ErrUnavailable, true}, {roamerr.ErrTypeMismatch, true},
		{roamerr.ErrNotFound, false}, {roamerr.ErrDeadlineExceeded, false}, {roamerr.ErrCapacityExceeded, false},
	} {
		if got := Refused(roamerr.FromCode(roamerr.Code(tc.err), "x")); got != tc.drop {
			t.Errorf("%v: drop %v, want %v", tc.err, got, tc.drop)
		}
	}
}

// TestComplete: a SpotActivation names the call's operation, Spot,
// deadline and calling lifecycle; the owner's names its fence and the
// stored type.
func TestComplete(t *testing.T) {
	f := found(location.KindInstanceSpot, creating, false)
	act := OwnersActivation(f.V.Record)
	Complete(act, "op1", "s1", now, "n5", 9)
	if act.GetOperationId() != "op1" || act.GetRouteKind() != 2 || act.GetSpotId() != "s1" || act.GetDeadlineUnixNanos() != now.UnixNano() ||
		act.GetSourceNodeRid() != "n5" || act.GetSourceNodeGeneration() != 9 || !act.GetHasMetadata() ||
		act.GetTargetMesh() != "m1" || act.GetTargetNodeRid() != "n1" || act.GetTargetNodeGeneration() != 7 || act.GetStableType() != "counter" || act.GetSourceReadMissing() {
		t.Fatalf("envelope %v", act)
	}
}

// A resolve that is kept goes into an empty cache; one of the incarnation
// cached leaves the cached route (and its age) alone; one of another
// incarnation drains the cached route first, and one that meets a route
// being drained waits for it. What is not kept leaves the cache alone.
// Reference: docs/PROTOCOL.md §7.8.
func TestRoutePolicyPut(t *testing.T) {
	p := RoutePolicy{MaxAge: time.Second}
	live := Resolved{V: found(location.KindInstanceSpot, ready, false).V}
	gone := Resolved{V: live.V, Ended: true}
	for _, tc := range []struct {
		name                   string
		r                      Resolved
		cached, draining, same bool
		want                   RoutePut
	}{
		{"not kept", gone, true, false, false, PutNone},
		{"nothing cached", live, false, false, false, PutNew},
		{"the same incarnation", live, true, false, true, PutSame},
		{"another incarnation", live, true, false, false, PutDrain},
		{"a route being drained", live, true, true, true, PutWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Put(tc.r, tc.cached, tc.draining, tc.same); got != tc.want {
				t.Fatalf("Put = %d, want %d", got, tc.want)
			}
		})
	}
	if got := (RoutePolicy{}).Put(live, false, false, false); got != PutNone {
		t.Fatalf("Put with the cache off = %d, want PutNone", got)
	}
}
