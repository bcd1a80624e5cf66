package sessionhost_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// End to end, on nodes of one process: each rule of docs/SESSIONS.md that
// spec'd behaviour hangs on, with a test that fails when it breaks.

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) has(event string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), `"event":"`+event+`"`)
}

// gate blocks a journal's "block" turn until opened.
type gate struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *gate) arm() { g.mu.Lock(); g.ch = make(chan struct{}); g.mu.Unlock() }
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}
func (g *gate) wait() {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// journal is a bound Actor that writes down the client messages it
// handled, in order; "block" waits at the gate; "log" answers the
// journal. The journal moves with it; a restore fails while failRestore
// is set (an explicit failure before relay-ready).
type journal struct {
	g       *gate
	fail    *sync.Map
	entries []string
}

func (j *journal) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.SessionBound:
		j.entries = append(j.entries, "bound")
	case *wrapperspb.StringValue:
		switch m.GetValue() {
		case "log":
			c.Respond(wrapperspb.String(strings.Join(j.entries, ",")))
			return
		case "block":
			j.g.wait()
		}
		j.entries = append(j.entries, m.GetValue())
		if c.Sender() != nil {
			c.Respond(wrapperspb.String(m.GetValue()))
		}
	}
}

func (j *journal) CaptureState() ([]byte, error) {
	return proto.Marshal(wrapperspb.String(strings.Join(j.entries, ",")))
}

func (j *journal) RestoreState(b []byte) error {
	if _, bad := j.fail.Load("restore"); bad {
		return roamerr.ErrInvalidOperation
	}
	var v wrapperspb.StringValue
	if err := proto.Unmarshal(b, &v); err != nil {
		return err
	}
	j.entries = strings.Split(v.GetValue(), ",")
	return nil
}

type cluster struct {
	store location.Store
	g     *gate
	fail  *sync.Map
	logs  *logBuffer
	gw, b *roam.Roam
	// node starts one more node of the cluster.
	node func(name string) *roam.Roam
}

func newCluster(t *testing.T, cfg session.Config) *cluster {
	cl := &cluster{store: memstore.New(), g: &gate{}, fail: &sync.Map{}, logs: &logBuffer{}}
	kind := roam.NewKind("journal", actor.PropsFromProducer(func() actor.Actor { return &journal{g: cl.g, fail: cl.fail} }), roam.PreserveState())
	node := func(name string) *roam.Roam {
		system := actor.NewActorSystem()
		r, err := roam.New(system, roam.WithStore(cl.store), roam.WithKinds(kind), roam.WithNodeName(name),
			roam.WithLogger(zerolog.New(cl.logs)), roam.WithLeaseTTL(2*time.Second), roam.WithSessionConfig(roam.SessionConfig(cfg)))
		require.NoError(t, err)
		require.NoError(t, r.Start(context.Background()))
		t.Cleanup(func() {
			cl.g.open()
			_ = r.Stop(context.Background())
			system.Shutdown()
		})
		return r
	}
	cl.gw, cl.b = node("gw"), node("b")
	cl.node = node
	return cl
}

// sealedWhileBlocked makes alice, bound to a new Session on the gateway,
// busy in a long turn with one message queued behind it, starts her move
// to b, and returns once the Session owner sealed her binding (the source
// waits for her turn to end before it seals): what the client sends now
// is held. The move's result comes on the channel.
func (cl *cluster) sealedWhileBlocked(t *testing.T, opts roam.SessionOptions) (*roam.Session, <-chan error) {
	ctx := context.Background()
	s, err := cl.gw.OpenSession(opts)
	require.NoError(t, err)
	_, err = s.SpawnActor(ctx, "journal", "alice")
	require.NoError(t, err)
	cl.g.arm()
	require.NoError(t, s.Send("alice", wrapperspb.String("block")))
	require.NoError(t, s.Send("alice", wrapperspb.String("queued")))
	moved := make(chan error, 1)
	go func() {
		_, err := cl.gw.Relocate(ctx, roam.ActorRef("alice"), "b")
		moved <- err
	}()
	testwait.For(t, func() bool { return sessionhost.Unwrap(s).Sealed("alice") }, "the Session owner seals before the source")
	return s, moved
}

func journalOf(t *testing.T, s *roam.Session) string {
	t.Helper()
	res, err := s.Request(context.Background(), "alice", wrapperspb.String("log"))
	require.NoError(t, err)
	return res.(*wrapperspb.StringValue).GetValue()
}

// Client messages that arrive while the binding is sealed are held, then
// submitted to the target after the route update, in order, before any
// later one; then the seal is released. Other bindings of the Session are
// not held meanwhile.
func TestHeldMessagesGoToTheTargetAfterTheRouteUpdate(t *testing.T) {
	cl := newCluster(t, session.Config{})
	s, moved := cl.sealedWhileBlocked(t, roam.SessionOptions{})
	ctx := context.Background()
	_, err := s.SpawnActor(ctx, "journal", "bob")
	require.NoError(t, err)

	require.NoError(t, s.Send("alice", wrapperspb.String("h1")))
	reply := make(chan error, 1)
	go func() {
		_, err := s.Request(ctx, "alice", wrapperspb.String("h2"))
		reply <- err
	}()
	testwait.For(t, func() bool { return sessionhost.Unwrap(s).Held("alice") == 2 }, "both held while sealed")
	res, err := s.Request(ctx, "bob", wrapperspb.String("other"))
	require.NoError(t, err, "another binding of the Session is not sealed")
	require.Equal(t, "other", res.(*wrapperspb.StringValue).GetValue())

	cl.g.open()
	require.NoError(t, <-moved)
	require.NoError(t, <-reply)
	require.NoError(t, s.Send("alice", wrapperspb.String("after")))
	require.Equal(t, "bound,block,queued,h1,h2,after", journalOf(t, s), "held after what moved, before what came next")
	require.False(t, sessionhost.Unwrap(s).Sealed("alice"))
	require.Zero(t, sessionhost.Unwrap(s).Held("alice"))
	pid, err := cl.gw.Resolve(ctx, roam.ActorRef("alice"))
	require.NoError(t, err)
	require.Equal(t, cl.b.System().Address(), pid.Address)
	require.NoError(t, s.Err())
}

// Past the hold's bound a client message is refused CapacityExceeded at
// once, not held and not dropped silently; the Session stays open and the
// held ones still arrive.
func TestHoldLimitRefusesWithCapacityExceeded(t *testing.T) {
	cl := newCluster(t, session.Config{HoldLimit: 2})
	s, moved := cl.sealedWhileBlocked(t, roam.SessionOptions{})
	require.NoError(t, s.Send("alice", wrapperspb.String("h1")))
	require.NoError(t, s.Send("alice", wrapperspb.String("h2")))
	require.ErrorIs(t, s.Send("alice", wrapperspb.String("h3")), roamerr.ErrCapacityExceeded)
	_, err := s.Request(context.Background(), "alice", wrapperspb.String("h4"))
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	cl.g.open()
	require.NoError(t, <-moved)
	// Relocate returns once the commit is in the store; the route update
	// follows the target's open.
	testwait.For(t, func() bool { return !sessionhost.Unwrap(s).Sealed("alice") }, "the route update releases the seal")
	require.Equal(t, "bound,block,queued,h1,h2", journalOf(t, s))
	require.NoError(t, s.Err())
}

// No route update within the seal timeout: the Session owner closes the
// connection and clears binding, held messages and seal
// (session_seal_timeout); a route update that comes after only logs
// session_route_update_ignored and changes nothing.
func TestSealTimeoutClosesTheSessionAndALateUpdateIsIgnored(t *testing.T) {
	cl := newCluster(t, session.Config{SealTimeout: 300 * time.Millisecond})
	closed := make(chan error, 1)
	s, moved := cl.sealedWhileBlocked(t, roam.SessionOptions{OnClose: func(err error) { closed <- err }})
	var late struct {
		sync.Mutex
		m *messages.SessionRouteUpdate
	}
	sessionhost.Unwrap(s).DropCommands(func(m any) bool {
		u, ok := m.(*messages.SessionRouteUpdate)
		if ok {
			late.Lock()
			late.m = u
			late.Unlock()
		}
		return ok
	})
	held := make(chan error, 1)
	go func() {
		_, err := s.Request(context.Background(), "alice", wrapperspb.String("h1"))
		held <- err
	}()
	testwait.For(t, func() bool { return sessionhost.Unwrap(s).Held("alice") == 1 }, "held")
	cl.g.open()
	require.NoError(t, <-moved, "the move itself succeeds: only its route update is lost")

	err := <-closed
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.ErrorIs(t, s.Err(), roamerr.ErrUnavailable)
	require.ErrorIs(t, <-held, roamerr.ErrUnavailable, "a held request ends with the Session")
	require.True(t, cl.logs.has("session_seal_timeout"))
	require.ErrorIs(t, s.Send("alice", wrapperspb.String("x")), roamerr.ErrUnavailable, "cleared")

	// The route update arrives late, from the target's address.
	sessionhost.Unwrap(s).DropCommands(nil)
	late.Lock()
	u := late.m
	late.Unlock()
	require.NotNil(t, u)
	from := actor.NewPID(cl.b.System().Address(), "roam/relocation")
	cl.gw.System().Root.RequestWithCustomSender(sessionhost.Unwrap(s).Self().(*actor.PID), u, from)
	testwait.For(t, func() bool { return cl.logs.has("session_route_update_ignored") }, "a late route update only warns")
	require.ErrorIs(t, s.Send("alice", wrapperspb.String("x")), roamerr.ErrUnavailable, "and changes nothing")
}

// An explicit failure before relay-ready (the target cannot restore):
// the source serves again from its restored queue first, then the abort
// (command 44) releases the seal, and the held messages run behind the
// restored queue, at the source; the Session stays open past the seal
// timeout.
func TestAbortReleasesTheSealOnlyAfterTheSourceRestored(t *testing.T) {
	cl := newCluster(t, session.Config{SealTimeout: 300 * time.Millisecond})
	s, moved := cl.sealedWhileBlocked(t, roam.SessionOptions{})
	cl.fail.Store("restore", true)
	require.NoError(t, s.Send("alice", wrapperspb.String("h1")))
	require.NoError(t, s.Send("alice", wrapperspb.String("h2")))
	testwait.For(t, func() bool { return sessionhost.Unwrap(s).Held("alice") == 2 }, "held")
	cl.g.open()
	require.Error(t, <-moved, "the target failed the move")
	require.Equal(t, "bound,block,queued,h1,h2", journalOf(t, s), "the restored queue first, then what was held")
	pid, err := cl.gw.Resolve(context.Background(), roam.ActorRef("alice"))
	require.NoError(t, err)
	require.Equal(t, cl.gw.System().Address(), pid.Address, "alice serves on at the source")
	require.False(t, sessionhost.Unwrap(s).Sealed("alice"))
	require.False(t, cl.logs.has("session_abort_ignored"))
	require.NoError(t, s.Err())
}

// boundAliceWithAJournal opens a Session on node, spawns alice bound to it
// and has her journal one message; it returns the Session and her journal.
func boundAliceWithAJournal(t *testing.T, node *roam.Roam) (*roam.Session, string) {
	t.Helper()
	s, err := node.OpenSession(roam.SessionOptions{})
	require.NoError(t, err)
	_, err = s.SpawnActor(context.Background(), "journal", "alice")
	require.NoError(t, err)
	require.NoError(t, s.Send("alice", wrapperspb.String("one")))
	journal := journalOf(t, s)
	require.Contains(t, journal, "one")
	return s, journal
}

// logOf is alice's journal, asked by her PID (no Session needed).
func (cl *cluster) logOf(t *testing.T, from *roam.Roam) string {
	t.Helper()
	ctx := context.Background()
	pid, err := from.Resolve(ctx, roam.ActorRef("alice"))
	require.NoError(t, err)
	res, err := from.System().Root.RequestFuture(pid, wrapperspb.String("log"), 10*time.Second).Result()
	require.NoError(t, err)
	return res.(*wrapperspb.StringValue).GetValue()
}

// An Actor whose Session was closed (its bindings go, the Actor serves on)
// still moves: the Session owner answers it binds no such Actor, and the
// move goes on unbound (session_binding_dropped), its record without the
// binding. Before, every move of it was refused for good, so a drain
// could never empty its node.
func TestAnActorOfAClosedSessionStillMoves(t *testing.T) {
	cl := newCluster(t, session.Config{})
	ctx := context.Background()
	s, before := boundAliceWithAJournal(t, cl.gw)
	s.Close()

	_, err := cl.gw.Relocate(ctx, roam.ActorRef("alice"), "b")
	require.NoError(t, err, "moved although its Session is closed")
	require.True(t, cl.logs.has("session_binding_dropped"))
	v, err := cl.store.Read(ctx, location.Key(location.KindActor, "alice"))
	require.NoError(t, err)
	require.Empty(t, v.Record.GetSessionId(), "the record keeps no binding to a closed Session")
	require.Equal(t, before, cl.logOf(t, cl.gw), "with its state")
	_, err = cl.b.Relocate(ctx, roam.ActorRef("alice"), "gw")
	require.NoError(t, err, "and moves again")
}

// An Actor whose Session owner's node has stopped (its Sessions ended with
// it) still moves: the seal request gets no answer, the node is no live
// member any more, and the move goes on unbound.
func TestAnActorWhoseSessionOwnerLeftStillMoves(t *testing.T) {
	cl := newCluster(t, session.Config{})
	ctx := context.Background()
	c := cl.node("c")
	_, before := boundAliceWithAJournal(t, cl.b)
	_, err := cl.b.Relocate(ctx, roam.ActorRef("alice"), "gw")
	require.NoError(t, err)
	require.NoError(t, cl.b.Stop(ctx))

	_, err = cl.gw.Relocate(ctx, roam.ActorRef("alice"), "c")
	require.NoError(t, err, "moved although its Session owner's node is gone")
	require.True(t, cl.logs.has("session_binding_dropped"))
	require.Equal(t, before, cl.logOf(t, c), "with its state")
}

// Sessions open on a node are bounded: one past MaxSessions is refused
// CapacityExceeded; closing one makes room.
func TestSessionsPerNodeAreBounded(t *testing.T) {
	cl := newCluster(t, session.Config{MaxSessions: 3})
	var open []*roam.Session
	for range 3 {
		s, err := cl.gw.OpenSession(roam.SessionOptions{})
		require.NoError(t, err)
		open = append(open, s)
	}
	_, err := cl.gw.OpenSession(roam.SessionOptions{})
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	open[0].Close()
	s, err := cl.gw.OpenSession(roam.SessionOptions{})
	require.NoError(t, err, "a closed Session makes room")
	s.Close()
}
