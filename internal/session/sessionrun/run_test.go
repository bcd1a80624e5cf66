package sessionrun

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
)

const sid session.ID = "s1"

var (
	src  = session.Route{Address: "n1", OwnerGeneration: 1, ObjectGeneration: 1, NodeRid: "r1"}
	dst  = session.Route{Address: "n2", OwnerGeneration: 2, ObjectGeneration: 1, NodeRid: "r2"}
	move = handoff.Identity{RelocationID: 7, TargetAttemptGeneration: 1}
)

// fakeEnv records the primitives the runner calls, in order; timers and
// looks only record their arming, the test fires and answers them.
type fakeEnv struct {
	calls []string
	armed map[Timer]time.Duration
}

func (f *fakeEnv) add(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeEnv) Deliver(actor string, r session.Route, item session.Item) {
	f.add("deliver %v to %s at %s", item.Msg, actor, r.Address)
}
func (f *fakeEnv) Refuse(item session.Item, err error) { f.add("refuse %v", item.Msg) }
func (f *fakeEnv) ReplySeal(r session.ReplySeal) {
	f.add("reply seal to %s err=%v", r.To, r.Err != nil)
}
func (f *fakeEnv) Reject(err error) { f.add("reject") }
func (f *fakeEnv) Arm(t Timer, d time.Duration) {
	f.armed[t] = d
	f.add("arm %s look=%v", d, t.Look)
}
func (f *fakeEnv) Stop(t Timer) {
	delete(f.armed, t)
	f.add("stop look=%v", t.Look)
}
func (f *fakeEnv) Look(s session.ID, actor string)      { f.add("look %s", actor) }
func (f *fakeEnv) Recovered(s session.ID, actor string) { f.add("recovered %s", actor) }
func (f *fakeEnv) Closed(s session.ID, err error)       { f.add("closed %s", s) }
func (f *fakeEnv) Log(l session.Log)                    {}

// bound is a runner with Session s1 open and Actor a bound at src.
func bound(t *testing.T) (*Runner, *fakeEnv) {
	t.Helper()
	env := &fakeEnv{armed: map[Timer]time.Duration{}}
	r := New(session.New(session.Config{SealTimeout: 3 * time.Second, RecoveryWait: time.Minute}), env)
	r.Step(session.OpenSession{Session: sid})
	r.Step(session.Bind{Session: sid, Actor: "a", Route: src})
	require.Empty(t, env.calls)
	return r, env
}

// take returns the calls so far and forgets them.
func (f *fakeEnv) take() []string {
	c := f.calls
	f.calls = nil
	return c
}

func client(r *Runner, msg string, routeDown bool) {
	r.Step(session.Client{Session: sid, Actor: "a", Item: session.Item{Msg: msg, Bytes: 1}, RouteDown: routeDown})
}

func sealTimer() Timer { return Timer{Session: sid, Actor: "a", Move: move} }

func lookTimer() Timer { return Timer{Session: sid, Actor: "a", Look: true} }

// A seal arms its timer before the sealed answer goes; what the client
// sends meanwhile is held; the route update stops the timer and delivers
// it to the target in order.
func TestRouteUpdateDeliversHeldInOrder(t *testing.T) {
	r, env := bound(t)
	r.Step(session.SealRequest{From: "n1", Session: sid, Actor: "a", Move: move, Source: src})
	require.Equal(t, []string{"arm 3s look=false", "reply seal to n1 err=false"}, env.take())

	client(r, "m1", false)
	client(r, "m2", false)
	require.Empty(t, env.take(), "held while sealed")

	r.Step(session.RouteUpdate{From: "n2", Session: sid, Actor: "a", Move: move, Target: dst})
	require.Equal(t, []string{"stop look=false", "deliver m1 to a at n2", "deliver m2 to a at n2"}, env.take())
	require.Empty(t, env.armed)
	_, sealed, ok := r.Owner().BindingOf(sid, "a")
	require.True(t, ok)
	require.False(t, sealed)
}

// A seal neither updated nor aborted in time: its timer's expiry steps
// SealExpired, which refuses what was held and closes the Session.
func TestSealTimerExpiryClosesTheSession(t *testing.T) {
	r, env := bound(t)
	r.Step(session.SealRequest{From: "n1", Session: sid, Actor: "a", Move: move, Source: src})
	client(r, "m1", false)
	env.take()

	require.Contains(t, env.armed, sealTimer())
	r.Fire(sealTimer())
	require.Equal(t, []string{"stop look=false", "refuse m1", "closed s1"}, env.take())

	r.Fire(sealTimer()) // twice: nothing more
	require.Empty(t, env.take())
}

// A binding whose route went down is looked up at once; a notice that
// comes while the store is read is not lost: another look follows the
// answer, and only one look is ever under way.
func TestANoticeDuringTheReadMakesAnotherLookFollow(t *testing.T) {
	r, env := bound(t)
	client(r, "m1", true)
	require.Equal(t, []string{"arm 1m0s look=false", "look a"}, env.take())

	r.Resolve(sid, "a") // a recovering node's word, while the store is read
	require.Empty(t, env.take(), "one look at a time")

	// The read saw the old owner, not alive: the owner asks to look again
	// later, but the notice asks for a look now.
	r.Looked(sid, "a", src, false, nil)
	require.Equal(t, []string{"arm 250ms look=true", "stop look=true", "look a"}, env.take())

	r.Looked(sid, "a", dst, true, nil)
	require.Equal(t, []string{"recovered a", "stop look=false", "deliver m1 to a at n2"}, env.take())
}

// A look that pauses (the owner's Resolve with After) is cut short by a
// notice: the pause's timer is stopped and the store read at once; the
// pause's fire, if on its way, reads nothing more.
func TestANoticeCutsALooksPauseShort(t *testing.T) {
	r, env := bound(t)
	client(r, "m1", true)
	env.take()
	r.Looked(sid, "a", src, false, fmt.Errorf("store unavailable"))
	require.Equal(t, []string{"arm 250ms look=true"}, env.take(), "a failed look is tried again after a pause")

	r.Resolve(sid, "a")
	require.Equal(t, []string{"stop look=true", "look a"}, env.take())
	r.Fire(lookTimer())
	require.Empty(t, env.take(), "the pause's late fire must not start a second look")

	r.Looked(sid, "a", dst, true, nil)
	require.Equal(t, []string{"recovered a", "stop look=false", "deliver m1 to a at n2"}, env.take())
}

// The pause ends by its timer: the store is read then.
func TestALooksPauseEndsByItsTimer(t *testing.T) {
	r, env := bound(t)
	client(r, "m1", true)
	r.Looked(sid, "a", src, false, nil)
	env.take()
	require.Contains(t, env.armed, lookTimer())
	r.Fire(lookTimer())
	require.Equal(t, []string{"look a"}, env.take())
}

// An Actor not bound to the Session is not looked for on a notice.
func TestANoticeForAnUnboundActorLooksNothingUp(t *testing.T) {
	r, env := bound(t)
	r.Resolve(sid, "b")
	require.Empty(t, env.take())
}

// Once closed with its node's lifecycle, no timer fires into the owner
// and the answer of a look under way is not stepped.
func TestAClosedRunnerStepsNoTimerAndNoLook(t *testing.T) {
	r, env := bound(t)
	client(r, "m1", true) // held while the store is read
	require.Equal(t, []string{"arm 1m0s look=false", "look a"}, env.take())
	r.Close()
	r.Looked(sid, "a", dst, true, nil)
	r.Fire(Timer{Session: sid, Actor: "a"})
	r.Resolve(sid, "a")
	require.Empty(t, env.take())
}
