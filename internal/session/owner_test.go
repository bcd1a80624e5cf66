package session

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/roamerr"
)

const (
	sid         ID = "s1"
	sealTimeout    = 1500 * time.Millisecond
)

var (
	srcRoute = Route{Address: "node-a", OwnerGeneration: 1, ObjectGeneration: 7}
	dstRoute = Route{Address: "node-b", OwnerGeneration: 2, ObjectGeneration: 7}
	testCfg  = Config{SealTimeout: sealTimeout}
)

func testMove(n uint64) handoff.Identity {
	return handoff.Identity{RelocationID: n, TargetAttemptGeneration: 1}
}

func testItem(n int) Item { return Item{Msg: n, Bytes: 10} }

// openBound opens sid with "alice" and "bob" bound at srcRoute.
func openBound(t *testing.T, cfg Config) *Owner {
	t.Helper()
	o := New(cfg)
	require.Empty(t, o.Step(OpenSession{Session: sid}))
	require.Empty(t, o.Step(Bind{Session: sid, Actor: "alice", Route: srcRoute}))
	require.Empty(t, o.Step(Bind{Session: sid, Actor: "bob", Route: srcRoute}))
	return o
}

// mustSeal seals actor (at srcRoute) for m and checks the two effects of a new seal.
func mustSeal(t *testing.T, o *Owner, actor string, m handoff.Identity) {
	t.Helper()
	effs := o.Step(SealRequest{From: srcRoute.Address, Session: sid, Actor: actor, Move: m, Source: srcRoute})
	require.Equal(t, []Effect{
		StartSealTimer{Session: sid, Actor: actor, Move: m, After: sealTimeout},
		ReplySeal{To: srcRoute.Address, Session: sid, Actor: actor, Move: m},
	}, effs)
}

func sendMsg(o *Owner, actor string, n int) []Effect {
	return o.Step(Client{Session: sid, Actor: actor, Item: testItem(n)})
}

func wantDeliveries(actor string, r Route, ns ...int) []Effect {
	var out []Effect
	for _, n := range ns {
		out = append(out, Deliver{Session: sid, Actor: actor, Route: r, Item: testItem(n)})
	}
	return out
}

// requireRefused checks that effs is exactly one Refuse of item n wrapping target.
func requireRefused(t *testing.T, effs []Effect, n int, target error) {
	t.Helper()
	require.Len(t, effs, 1)
	r, ok := effs[0].(Refuse)
	require.True(t, ok, "want Refuse, got %#v", effs[0])
	require.Equal(t, n, r.Item.Msg)
	require.ErrorIs(t, r.Err, target)
}

// requireOnlyLog checks that effs is exactly one Warning Log named event.
func requireOnlyLog(t *testing.T, effs []Effect, event string) {
	t.Helper()
	require.Len(t, effs, 1)
	l, ok := effs[0].(Log)
	require.True(t, ok, "want Log, got %#v", effs[0])
	require.Equal(t, event, l.Event)
	require.Equal(t, loglevel.Warn, l.Level)
}

type bindingState struct {
	Route          Route
	Sealed, Exists bool
	Held           int
}

func stateOf(o *Owner, actor string) bindingState {
	r, sealed, ok := o.BindingOf(sid, actor)
	return bindingState{Route: r, Sealed: sealed, Exists: ok, Held: o.Held(sid, actor)}
}

// SESSIONS.md §1 (Client messages, Seal): a client message of an unsealed
// binding goes at once to the binding route, in the client's order, and a
// seal touches only its own binding: bob's messages keep being delivered
// while alice's are held.
func TestClientMessagesGoToRouteInOrderAndSealIsPerBinding(t *testing.T) {
	o := openBound(t, testCfg)
	var got []Effect
	for n := 1; n <= 3; n++ {
		got = append(got, sendMsg(o, "alice", n)...)
	}
	require.Equal(t, wantDeliveries("alice", srcRoute, 1, 2, 3), got)

	mustSeal(t, o, "alice", testMove(1))
	require.Empty(t, sendMsg(o, "alice", 4))
	require.Equal(t, wantDeliveries("bob", srcRoute, 5), sendMsg(o, "bob", 5))
	require.Empty(t, sendMsg(o, "alice", 6))
	require.Equal(t, wantDeliveries("bob", srcRoute, 7), sendMsg(o, "bob", 7))
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "bob"))
	require.Equal(t, 2, o.Held(sid, "alice"))
}

// SESSIONS.md §2 (42 — seal): the checks of a seal request, in precedence
// sender, binding, route, other seal; a refusal changes nothing; a new
// seal starts the timer (After = SealTimeout) before its reply; the same
// move asking again is answered sealed with no second timer.
func TestSealRequestChecksInPrecedence(t *testing.T) {
	o := openBound(t, testCfg)
	reply := func(from string, s ID, actor string, m handoff.Identity, src Route) error {
		t.Helper()
		effs := o.Step(SealRequest{From: from, Session: s, Actor: actor, Move: m, Source: src})
		require.Len(t, effs, 1, "a refused or repeated seal has only its reply: %#v", effs)
		r, ok := effs[0].(ReplySeal)
		require.True(t, ok, "want ReplySeal, got %#v", effs[0])
		require.Equal(t, ReplySeal{To: from, Session: s, Actor: actor, Move: m, Err: r.Err}, r)
		return r.Err
	}
	m1, m2 := testMove(1), testMove(2)
	// Wrong sender wins over an unknown session, a stale route, anything.
	require.ErrorIs(t, reply("node-x", "nope", "alice", m1, srcRoute), roamerr.ErrPermissionDenied)
	require.ErrorIs(t, reply("node-x", sid, "alice", m1, dstRoute), roamerr.ErrPermissionDenied)
	require.ErrorIs(t, reply("node-x", sid, "alice", m1, srcRoute), roamerr.ErrPermissionDenied)
	// No session or no binding wins over the route.
	require.ErrorIs(t, reply(dstRoute.Address, "nope", "alice", m1, dstRoute), roamerr.ErrNotFound)
	require.ErrorIs(t, reply(dstRoute.Address, sid, "carol", m1, dstRoute), roamerr.ErrNotFound)
	// Another route is stale.
	require.ErrorIs(t, reply(dstRoute.Address, sid, "alice", m1, dstRoute), roamerr.ErrStale)
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "alice"))

	mustSeal(t, o, "alice", m1)
	// Stale wins over a seal of another move.
	require.ErrorIs(t, reply(dstRoute.Address, sid, "alice", m2, dstRoute), roamerr.ErrStale)
	require.ErrorIs(t, reply(srcRoute.Address, sid, "alice", m2, srcRoute), roamerr.ErrConflict)
	require.NoError(t, reply(srcRoute.Address, sid, "alice", m1, srcRoute))
	require.Equal(t, bindingState{Route: srcRoute, Sealed: true, Exists: true}, stateOf(o, "alice"))
	// The conflict did not hit bob, and a zero SealTimeout is the default 3 s.
	mustSeal(t, o, "bob", m2)
	d := New(Config{})
	d.Step(OpenSession{Session: sid})
	d.Step(Bind{Session: sid, Actor: "alice", Route: srcRoute})
	effs := d.Step(SealRequest{From: srcRoute.Address, Session: sid, Actor: "alice", Move: m1, Source: srcRoute})
	require.Equal(t, StartSealTimer{Session: sid, Actor: "alice", Move: m1, After: 3 * time.Second}, effs[0])
}

// SESSIONS.md §2 (43 — route update): while sealed, client messages are
// held; the matching update from the target's node stops the timer, sends
// every held message to the NEW route in order, moves the binding there,
// and a later client message follows the held ones on that route.
func TestRouteUpdateSendsHeldToNewRouteInOrder(t *testing.T) {
	o := openBound(t, testCfg)
	m := testMove(1)
	mustSeal(t, o, "alice", m)
	for n := 1; n <= 3; n++ {
		require.Empty(t, sendMsg(o, "alice", n), "a sealed binding delivers nothing")
	}
	require.Equal(t, 3, o.Held(sid, "alice"))

	effs := o.Step(RouteUpdate{From: dstRoute.Address, Session: sid, Actor: "alice", Move: m, Target: dstRoute})
	want := append([]Effect{StopSealTimer{Session: sid, Actor: "alice", Move: m}}, wantDeliveries("alice", dstRoute, 1, 2, 3)...)
	require.Equal(t, want, effs)
	require.Equal(t, bindingState{Route: dstRoute, Exists: true}, stateOf(o, "alice"))
	require.Equal(t, wantDeliveries("alice", dstRoute, 4), sendMsg(o, "alice", 4))
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "bob"))
}

// SESSIONS.md §3 (Holding, and its limits): a client message past the
// count or byte limit of a sealed binding is refused CapacityExceeded at
// once and not held; the Session stays open and what fits is still held.
func TestHoldLimitsRefuseWithoutClosing(t *testing.T) {
	cfg := Config{HoldLimit: 3, HoldBytes: 100, SealTimeout: sealTimeout}
	m := testMove(1)

	o := openBound(t, cfg)
	mustSeal(t, o, "alice", m)
	for n := 1; n <= 3; n++ {
		require.Empty(t, sendMsg(o, "alice", n))
	}
	requireRefused(t, sendMsg(o, "alice", 4), 4, roamerr.ErrCapacityExceeded)
	require.True(t, o.Open(sid))
	require.Equal(t, 3, o.Held(sid, "alice"))
	effs := o.Step(Abort{From: srcRoute.Address, Session: sid, Actor: "alice", Move: m})
	require.Equal(t, append([]Effect{StopSealTimer{Session: sid, Actor: "alice", Move: m}}, wantDeliveries("alice", srcRoute, 1, 2, 3)...), effs)

	o = openBound(t, cfg)
	mustSeal(t, o, "alice", m)
	client := func(n, size int) []Effect {
		return o.Step(Client{Session: sid, Actor: "alice", Item: Item{Msg: n, Bytes: size}})
	}
	require.Empty(t, client(1, 60))
	requireRefused(t, client(2, 41), 2, roamerr.ErrCapacityExceeded)
	require.True(t, o.Open(sid))
	require.Equal(t, 1, o.Held(sid, "alice"))
	require.Empty(t, client(3, 40), "exactly HoldBytes fits")
	requireRefused(t, client(4, 1), 4, roamerr.ErrCapacityExceeded)
	require.Equal(t, 2, o.Held(sid, "alice"))
	require.True(t, o.Open(sid))
}

// SESSIONS.md §4 (The seal timeout): the timer of the current seal closes
// the Session: a Warning session_seal_timeout, every held message refused
// Unavailable, then Closed with Unavailable; the Session is gone and later
// client messages are refused Unavailable.
func TestSealTimeoutClosesSession(t *testing.T) {
	o := openBound(t, testCfg)
	m := testMove(1)
	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	require.Empty(t, sendMsg(o, "alice", 2))

	effs := o.Step(SealExpired{Session: sid, Actor: "alice", Move: m})
	require.GreaterOrEqual(t, len(effs), 4)
	requireOnlyLog(t, effs[:1], "session_seal_timeout")
	closed, ok := effs[len(effs)-1].(Closed)
	require.True(t, ok, "last effect must be Closed, got %#v", effs[len(effs)-1])
	require.Equal(t, sid, closed.Session)
	require.ErrorIs(t, closed.Err, roamerr.ErrUnavailable)
	var refused []any
	for _, e := range effs[1 : len(effs)-1] {
		switch e := e.(type) {
		case Refuse:
			require.ErrorIs(t, e.Err, roamerr.ErrUnavailable)
			refused = append(refused, e.Item.Msg)
		case StopSealTimer:
			require.Equal(t, StopSealTimer{Session: sid, Actor: "alice", Move: m}, e)
		default:
			t.Fatalf("unexpected effect on seal timeout: %#v", e)
		}
	}
	require.Equal(t, []any{1, 2}, refused)
	require.False(t, o.Open(sid))
	require.Equal(t, bindingState{}, stateOf(o, "alice"))
	requireRefused(t, sendMsg(o, "alice", 3), 3, roamerr.ErrUnavailable)
	requireRefused(t, sendMsg(o, "bob", 4), 4, roamerr.ErrUnavailable)
}

// SESSIONS.md §4 with §2: a timer of a seal no longer current (released by
// an abort earlier, or a seal of another move now) fires into nothing: no
// effect, the Session stays open and the current seal keeps its messages.
func TestStaleSealTimerChangesNothing(t *testing.T) {
	o := openBound(t, testCfg)
	m1, m2 := testMove(1), testMove(2)
	mustSeal(t, o, "alice", m1)
	require.Len(t, o.Step(Abort{From: srcRoute.Address, Session: sid, Actor: "alice", Move: m1}), 1)
	require.Empty(t, o.Step(SealExpired{Session: sid, Actor: "alice", Move: m1}))
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "alice"))

	mustSeal(t, o, "alice", m2)
	require.Empty(t, sendMsg(o, "alice", 1))
	require.Empty(t, o.Step(SealExpired{Session: sid, Actor: "alice", Move: m1}))
	require.True(t, o.Open(sid))
	require.Equal(t, bindingState{Route: srcRoute, Sealed: true, Exists: true, Held: 1}, stateOf(o, "alice"))
}

// SESSIONS.md §2 (43) and §4: a route update from the wrong node, of
// another move, a duplicate, or one after the timeout is logged
// session_route_update_ignored (Warning) and changes nothing.
func TestRouteUpdateIgnored(t *testing.T) {
	o := openBound(t, testCfg)
	m := testMove(1)
	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	sealed := stateOf(o, "alice")

	update := func(from string, mv handoff.Identity) []Effect {
		return o.Step(RouteUpdate{From: from, Session: sid, Actor: "alice", Move: mv, Target: dstRoute})
	}
	requireOnlyLog(t, update("node-x", m), "session_route_update_ignored")
	require.Equal(t, sealed, stateOf(o, "alice"))
	requireOnlyLog(t, update(srcRoute.Address, m), "session_route_update_ignored")
	require.Equal(t, sealed, stateOf(o, "alice"))
	requireOnlyLog(t, update(dstRoute.Address, testMove(2)), "session_route_update_ignored")
	require.Equal(t, sealed, stateOf(o, "alice"))

	require.Len(t, update(dstRoute.Address, m), 2) // applied: stop + one delivery
	moved := stateOf(o, "alice")
	requireOnlyLog(t, update(dstRoute.Address, m), "session_route_update_ignored")
	require.Equal(t, moved, stateOf(o, "alice"))

	o = openBound(t, testCfg)
	mustSeal(t, o, "alice", m)
	o.Step(SealExpired{Session: sid, Actor: "alice", Move: m})
	requireOnlyLog(t, update(dstRoute.Address, m), "session_route_update_ignored")
	require.False(t, o.Open(sid))
}

// SESSIONS.md §2 (44 — abort): the matching abort from the binding route's
// node stops the timer and sends the held messages, in order, to the
// unchanged source route; the seal is released.
func TestAbortSendsHeldToSource(t *testing.T) {
	o := openBound(t, testCfg)
	m := testMove(1)
	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	require.Empty(t, sendMsg(o, "alice", 2))

	effs := o.Step(Abort{From: srcRoute.Address, Session: sid, Actor: "alice", Move: m})
	require.Equal(t, append([]Effect{StopSealTimer{Session: sid, Actor: "alice", Move: m}}, wantDeliveries("alice", srcRoute, 1, 2)...), effs)
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "alice"))
	require.Equal(t, wantDeliveries("alice", srcRoute, 3), sendMsg(o, "alice", 3))
}

// SESSIONS.md §2 (44): an abort of another move, from another node than
// the binding route's, or with no seal is logged session_abort_ignored
// (Warning) and changes nothing.
func TestAbortIgnored(t *testing.T) {
	o := openBound(t, testCfg)
	m := testMove(1)
	abort := func(from string, mv handoff.Identity) []Effect {
		return o.Step(Abort{From: from, Session: sid, Actor: "alice", Move: mv})
	}
	requireOnlyLog(t, abort(srcRoute.Address, m), "session_abort_ignored")
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "alice"))

	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	sealed := stateOf(o, "alice")
	requireOnlyLog(t, abort(srcRoute.Address, testMove(2)), "session_abort_ignored")
	require.Equal(t, sealed, stateOf(o, "alice"))
	requireOnlyLog(t, abort(dstRoute.Address, m), "session_abort_ignored")
	require.Equal(t, sealed, stateOf(o, "alice"))
}

// SESSIONS.md §4 and §1: closing a Session refuses its held messages with
// the given error, stops the timer of a sealed binding and ends with
// Closed; unbinding a sealed Actor refuses what it held NotFound and
// leaves the other bindings serving.
func TestCloseAndUnbindRefuseHeld(t *testing.T) {
	bye := errors.New("client went away")
	o := openBound(t, testCfg)
	m := testMove(1)
	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	require.Empty(t, sendMsg(o, "alice", 2))
	require.Equal(t, []Effect{
		StopSealTimer{Session: sid, Actor: "alice", Move: m},
		Refuse{Session: sid, Item: testItem(1), Err: bye},
		Refuse{Session: sid, Item: testItem(2), Err: bye},
		Closed{Session: sid, Err: bye},
	}, o.Step(CloseSession{Session: sid, Err: bye}))
	require.False(t, o.Open(sid))

	o = openBound(t, testCfg)
	mustSeal(t, o, "alice", m)
	require.Empty(t, sendMsg(o, "alice", 1))
	require.Empty(t, sendMsg(o, "alice", 2))
	effs := o.Step(Unbind{Session: sid, Actor: "alice"})
	require.Len(t, effs, 3)
	require.Equal(t, StopSealTimer{Session: sid, Actor: "alice", Move: m}, effs[0])
	requireRefused(t, effs[1:2], 1, roamerr.ErrNotFound)
	requireRefused(t, effs[2:3], 2, roamerr.ErrNotFound)
	require.Equal(t, bindingState{}, stateOf(o, "alice"))
	requireRefused(t, sendMsg(o, "alice", 3), 3, roamerr.ErrNotFound)
	require.Equal(t, wantDeliveries("bob", srcRoute, 4), sendMsg(o, "bob", 4))
}

// SESSIONS.md §1 (Session, Binding): a Session opens once, a Bind needs an
// open Session, and an Actor is bound at most once.
func TestOpenAndBindRejections(t *testing.T) {
	o := New(testCfg)
	rejected := func(effs []Effect, target error) {
		t.Helper()
		require.Len(t, effs, 1)
		r, ok := effs[0].(Reject)
		require.True(t, ok, "want Reject, got %#v", effs[0])
		require.ErrorIs(t, r.Err, target)
	}
	rejected(o.Step(Bind{Session: sid, Actor: "alice", Route: srcRoute}), roamerr.ErrNotFound)
	require.Empty(t, o.Step(OpenSession{Session: sid}))
	rejected(o.Step(OpenSession{Session: sid}), roamerr.ErrAlreadyExists)
	require.Empty(t, o.Step(Bind{Session: sid, Actor: "alice", Route: srcRoute}))
	rejected(o.Step(Bind{Session: sid, Actor: "alice", Route: dstRoute}), roamerr.ErrAlreadyExists)
	require.Equal(t, bindingState{Route: srcRoute, Exists: true}, stateOf(o, "alice"))
}

// SESSIONS.md §1–§4 together, under random events of every kind: every
// client message is answered exactly once (one Deliver or one Refuse) or
// is still held at the end; no Deliver reaches a binding while it is
// sealed (seal tracked from StartSealTimer / StopSealTimer / Closed, and
// cross-checked with BindingOf); a Deliver goes to the binding's route;
// each binding's messages are delivered in increasing client order.
func TestRandomInvariants(t *testing.T) {
	type key struct {
		s ID
		a string
	}
	sessions := []ID{"s1", "s2"}
	actors := []string{"a1", "a2"}
	routes := []Route{srcRoute, dstRoute, {Address: "node-c", OwnerGeneration: 3, ObjectGeneration: 1}}
	nodes := []string{"node-a", "node-b", "node-c"}

	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		o := New(Config{HoldLimit: 4, HoldBytes: 120, SealTimeout: sealTimeout})
		answered := map[int]int{}
		lastDelivered := map[key]int{}
		sealed := map[key]bool{}
		next := 0
		pick := func(n int) int { return rng.IntN(n) }
		for step := 0; step < 3000; step++ {
			k := key{sessions[pick(2)], actors[pick(2)]}
			mv := testMove(uint64(1 + pick(3)))
			cur, _, _ := o.BindingOf(k.s, k.a)
			if pick(4) > 0 {
				cur = routes[pick(3)] // often a route the binding does not have
			}
			from := cur.Address
			if pick(5) == 0 {
				from = nodes[pick(3)]
			}
			var ev Event
			switch r := pick(100); {
			case r < 40:
				next++
				ev = Client{Session: k.s, Actor: k.a, Item: Item{Msg: next, Bytes: 1 + pick(50)}}
			case r < 55:
				ev = SealRequest{From: from, Session: k.s, Actor: k.a, Move: mv, Source: cur}
			case r < 67:
				ev = RouteUpdate{From: from, Session: k.s, Actor: k.a, Move: mv, Target: cur}
			case r < 77:
				ev = Abort{From: from, Session: k.s, Actor: k.a, Move: mv}
			case r < 85:
				ev = SealExpired{Session: k.s, Actor: k.a, Move: mv}
			case r < 90:
				ev = OpenSession{Session: k.s}
			case r < 95:
				ev = Bind{Session: k.s, Actor: k.a, Route: routes[pick(3)]}
			case r < 97:
				ev = Unbind{Session: k.s, Actor: k.a}
			default:
				ev = CloseSession{Session: k.s, Err: roamerr.ErrUnavailable}
			}
			answer := func(it Item) {
				n := it.Msg.(int)
				require.True(t, n >= 1 && n <= next, "seed %d step %d: unknown item %d", seed, step, n)
				answered[n]++
				require.Equal(t, 1, answered[n], "seed %d step %d: item %d answered twice", seed, step, n)
			}
			for _, e := range o.Step(ev) {
				switch e := e.(type) {
				case StartSealTimer:
					bk := key{e.Session, e.Actor}
					require.False(t, sealed[bk], "seed %d step %d: second timer for %v", seed, step, bk)
					sealed[bk] = true
				case StopSealTimer:
					sealed[key{e.Session, e.Actor}] = false
				case Closed:
					for _, a := range actors {
						sealed[key{e.Session, a}] = false
					}
				case Deliver:
					bk := key{e.Session, e.Actor}
					require.False(t, sealed[bk], "seed %d step %d: Deliver to sealed %v", seed, step, bk)
					route, _, ok := o.BindingOf(e.Session, e.Actor)
					require.True(t, ok)
					require.Equal(t, route, e.Route, "seed %d step %d: Deliver off the binding route", seed, step)
					answer(e.Item)
					n := e.Item.Msg.(int)
					require.Greater(t, n, lastDelivered[bk], "seed %d step %d: out of order for %v", seed, step, bk)
					lastDelivered[bk] = n
				case Refuse:
					answer(e.Item)
				}
			}
			for _, s := range sessions {
				for _, a := range actors {
					_, isSealed, _ := o.BindingOf(s, a)
					require.Equal(t, isSealed, sealed[key{s, a}], "seed %d step %d: seal of %s/%s", seed, step, s, a)
				}
			}
		}
		held := 0
		for _, s := range sessions {
			for _, a := range actors {
				held += o.Held(s, a)
			}
		}
		require.Equal(t, next-held, len(answered), "seed %d: unanswered items must be exactly the held ones", seed)
		require.Positive(t, next)
	}
}

// only keeps the effects of type T.
func only[T Effect](effs []Effect) []T {
	var out []T
	for _, e := range effs {
		if x, ok := e.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

// deliveries keeps the Deliver effects, as effects.
func deliveries(effs []Effect) []Effect {
	var out []Effect
	for _, d := range only[Deliver](effs) {
		out = append(out, d)
	}
	return out
}

// A message to a binding whose route is down is held, not delivered; the
// Session looks the Actor up (Resolve), and keeps looking while its owner
// is not alive. The store naming a newer incarnation of the same object
// (recovered) releases what was held to it, in order, and tells the
// client (Recovered); later messages go there at once.
func TestRouteDownHoldsUntilTheActorIsRecovered(t *testing.T) {
	o := openBound(t, Config{SealTimeout: sealTimeout, RecoveryWait: time.Minute})
	effs := o.Step(Client{Session: sid, Actor: "alice", Item: testItem(1), RouteDown: true})
	require.Empty(t, deliveries(effs))
	require.Equal(t, []Resolve{{Session: sid, Actor: "alice"}}, only[Resolve](effs))
	require.Equal(t, []StartSealTimer{{Session: sid, Actor: "alice", After: time.Minute}}, only[StartSealTimer](effs))
	require.Empty(t, sendMsg(o, "alice", 2), "held behind the first")
	require.Equal(t, wantDeliveries("bob", srcRoute, 9), sendMsg(o, "bob", 9), "another binding is not held")

	effs = o.Step(Resolved{Session: sid, Actor: "alice", Route: srcRoute})
	require.Equal(t, []Effect{Resolve{Session: sid, Actor: "alice", After: resolveAgain}}, effs, "the old owner, not alive: look again")
	recovered := Route{Address: "node-c", OwnerGeneration: srcRoute.OwnerGeneration + 1, ObjectGeneration: srcRoute.ObjectGeneration}
	effs = o.Step(Resolved{Session: sid, Actor: "alice", Route: recovered, Alive: true})
	require.Equal(t, []Recovered{{Session: sid, Actor: "alice", Route: recovered}}, only[Recovered](effs))
	require.Equal(t, wantDeliveries("alice", recovered, 1, 2), deliveries(effs))
	require.Equal(t, wantDeliveries("alice", recovered, 3), sendMsg(o, "alice", 3))
}

// A route that was only briefly down (its owner alive at the same route)
// gets what was held; another object's incarnation (another generation)
// is never taken for the Actor's.
func TestRouteDownReleasedToTheSameRouteWhenItsOwnerLives(t *testing.T) {
	o := openBound(t, Config{SealTimeout: sealTimeout})
	o.Step(Client{Session: sid, Actor: "alice", Item: testItem(1), RouteDown: true})
	other := Route{Address: "node-c", OwnerGeneration: 1, ObjectGeneration: srcRoute.ObjectGeneration + 1}
	require.Equal(t, []Effect{Resolve{Session: sid, Actor: "alice", After: resolveAgain}}, o.Step(Resolved{Session: sid, Actor: "alice", Route: other, Alive: true}))
	effs := o.Step(Resolved{Session: sid, Actor: "alice", Route: srcRoute, Alive: true})
	require.Equal(t, wantDeliveries("alice", srcRoute, 1), deliveries(effs))
	require.Empty(t, only[Recovered](effs))
}

// No recovery within RecoveryWait: the Session closes, what it held is
// refused, and its client is told why.
func TestRecoveryWaitClosesTheSession(t *testing.T) {
	o := openBound(t, Config{SealTimeout: sealTimeout, RecoveryWait: time.Minute})
	o.Step(Client{Session: sid, Actor: "alice", Item: testItem(1), RouteDown: true})
	effs := o.Step(SealExpired{Session: sid, Actor: "alice"})
	require.Len(t, only[Refuse](effs), 1)
	closed := only[Closed](effs)
	require.Len(t, closed, 1)
	require.ErrorIs(t, closed[0].Err, roamerr.ErrUnavailable)
	require.False(t, o.Open(sid))
}

// A route given without its node lifecycle (by a node of an older
// version) takes the store's once a look names the same incarnation: a
// Leaving of another lifecycle at the address does not take it down again.
func TestALookGivesARouteItsNodeLifecycle(t *testing.T) {
	o := openBound(t, Config{SealTimeout: sealTimeout})
	require.Empty(t, srcRoute.NodeRid, "bound by a node that does not send its lifecycle")
	o.Step(Client{Session: sid, Actor: "alice", Item: testItem(1), RouteDown: true})
	named := srcRoute
	named.NodeRid = "rid-of-the-owner"
	effs := o.Step(Resolved{Session: sid, Actor: "alice", Route: named, Alive: true})
	require.Len(t, deliveries(effs), 1)
	r, sealed, ok := o.BindingOf(sid, "alice")
	require.True(t, ok)
	require.False(t, sealed)
	require.Equal(t, named, r)
}
