package roam_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// user is an Actor bound to a client Session: each request "n" counts,
// pushes the count to its Session and answers it; its count and its
// Session's PID move with it.
type user struct {
	session *actor.PID
	count   int64
}

func (u *user) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.SessionBound:
		u.session = actor.NewPID(m.GetSession().GetAddress(), m.GetSession().GetId())
	case *wrapperspb.StringValue:
		u.count++
		if u.session != nil {
			c.Send(u.session, wrapperspb.String(m.GetValue()))
		}
		if c.Sender() != nil {
			c.Respond(wrapperspb.Int64(u.count))
		}
	}
}

func (u *user) CaptureState() ([]byte, error) {
	s := ""
	if u.session != nil {
		s = u.session.Address + "|" + u.session.Id
	}
	return proto.Marshal(wrapperspb.String(fmt.Sprintf("%d|%s", u.count, s)))
}

func (u *user) RestoreState(b []byte) error {
	var v wrapperspb.StringValue
	if err := proto.Unmarshal(b, &v); err != nil {
		return err
	}
	parts := strings.SplitN(v.GetValue(), "|", 3)
	u.count, _ = strconv.ParseInt(parts[0], 10, 64)
	if len(parts) == 3 {
		u.session = actor.NewPID(parts[1], parts[2])
	}
	return nil
}

var userKind = roam.NewKind("session-user", actor.PropsFromProducer(func() actor.Actor { return &user{} }), roam.PreserveState())

// pushLog collects a Session's pushes.
type pushLog struct {
	mu     sync.Mutex
	pushes []string
	closed []error
}

func (p *pushLog) onPush(m any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := m.(*wrapperspb.StringValue); ok {
		p.pushes = append(p.pushes, s.GetValue())
	}
}

func (p *pushLog) onClose(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = append(p.closed, err)
}

func (p *pushLog) snapshot() ([]string, []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.pushes...), append([]error(nil), p.closed...)
}

// A client's Session stays on its gateway while the Actor bound to it
// moves between the other nodes: every client message is handled once, in
// the client's order (requests answered with consecutive counts, sends
// counted too), every push reaches the client in order, and the Session
// is never closed.
func TestBoundActorMovesWhileItsSessionStays(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	gw := start(t, store, roam.WithNodeName("gw"), roam.WithKinds(userKind))
	b := start(t, store, roam.WithNodeName("b"), roam.WithKinds(userKind))
	c := start(t, store, roam.WithNodeName("c"), roam.WithKinds(userKind))
	_ = b
	_ = c

	log := &pushLog{}
	s, err := gw.OpenSession(roam.SessionOptions{OnPush: log.onPush, OnClose: log.onClose})
	require.NoError(t, err)
	_, err = s.SpawnActor(ctx, "session-user", "alice")
	require.NoError(t, err)

	const n = 400
	moved := make(chan error, 1)
	go func() {
		targets := []string{"b", "c", "gw", "b", "c", "b", "gw"}
		for _, tgt := range targets {
			if _, err := gw.Relocate(ctx, roam.ActorRef("alice"), tgt); err != nil {
				moved <- err
				return
			}
		}
		moved <- nil
	}()
	var want []string
	for i := 1; i <= n; i++ {
		v := strconv.Itoa(i)
		want = append(want, v)
		if i%3 == 0 {
			require.NoError(t, s.Send("alice", wrapperspb.String(v)), "send %d", i)
			continue
		}
		res, err := s.Request(ctx, "alice", wrapperspb.String(v))
		require.NoError(t, err, "request %d", i)
		require.Equal(t, int64(i), res.(*wrapperspb.Int64Value).GetValue(), "request %d handled after every earlier message, once", i)
	}
	require.NoError(t, <-moved)
	testwait.For(t, func() bool { p, _ := log.snapshot(); return len(p) >= n }, "every push reaches the client")
	pushes, closed := log.snapshot()
	require.Equal(t, want, pushes, "pushes in order, once each")
	require.Empty(t, closed)
	require.NoError(t, s.Err())

	pid, err := gw.Resolve(ctx, roam.ActorRef("alice"))
	require.NoError(t, err)
	require.Equal(t, gw.System().Address(), pid.Address)
	_, err = s.Request(ctx, "nobody", wrapperspb.String("x"))
	require.ErrorIs(t, err, roamerr.ErrNotFound)
}

// Bound Actors that are members of a SpotWide User Spot move with it: one
// move seals the bindings of two Sessions on the gateway, and updates
// both; a drain of the node that hosts them moves them again; each client
// keeps every count in order and every push, and no Session closes. A
// cross-node Join of a bound Actor moves it with its Session sealed too.
func TestBoundMembersMoveWithTheirSpotAndInADrain(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		gw := start(t, store, roam.WithNodeName("gw"), roam.WithKinds(userKind, teamKind))
		b := start(t, store, roam.WithNodeName("b"), roam.WithKinds(userKind, teamKind))
		c := start(t, store, roam.WithNodeName("c"), roam.WithKinds(userKind, teamKind))
		byRid := map[string]*roam.Roam{gw.NodeRid(): gw, b.NodeRid(): b, c.NodeRid(): c}

		res, err := b.Spots().GetOrCreate(ctx, "crew", "team")
		require.NoError(t, err)
		type client struct {
			s    *roam.Session
			log  *pushLog
			want []string
			n    int64
		}
		var clients []*client
		for _, id := range []string{"ann", "ben"} {
			cl := &client{log: &pushLog{}}
			cl.s, err = gw.OpenSession(roam.SessionOptions{OnPush: cl.log.onPush, OnClose: cl.log.onClose})
			require.NoError(t, err)
			_, err = cl.s.SpawnActor(ctx, "session-user", id)
			require.NoError(t, err)
			_, err = gw.JoinSpot(ctx, roam.ActorRef(id), res.Ref) // a cross-node Join unless crew is on gw
			require.NoError(t, err)
			clients = append(clients, cl)
		}
		talk := func(rounds int) {
			var wg sync.WaitGroup
			for i, cl := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := []string{"ann", "ben"}[i]
					for range rounds {
						cl.n++
						v := strconv.FormatInt(cl.n, 10)
						cl.want = append(cl.want, v)
						r, err := cl.s.Request(ctx, id, wrapperspb.String(v))
						if !assertNoError(t, err, "%s request %d", id, cl.n) {
							return
						}
						if r.(*wrapperspb.Int64Value).GetValue() != cl.n {
							t.Errorf("%s: request %d answered %d: lost or handled twice", id, cl.n, r.(*wrapperspb.Int64Value).GetValue())
							return
						}
					}
				}()
			}
			wg.Wait()
		}
		owner := func() *roam.Roam {
			v, err := store.Read(ctx, roam.UserSpotRef("crew"))
			require.NoError(t, err)
			return byRid[v.Record.GetOwner().GetNodeRid()]
		}

		done := make(chan struct{})
		go func() { defer close(done); talk(150) }()
		for _, to := range []string{"c", "b", "gw", "c"} {
			_, err := gw.Relocate(ctx, roam.UserSpotRef("crew"), to)
			require.NoError(t, err)
		}
		testwait.Recv(t, done, "the callers ended")

		done = make(chan struct{})
		go func() { defer close(done); talk(150) }()
		host := owner()
		dr, err := host.Drain(ctx, roam.DrainOptions{})
		require.NoError(t, err)
		require.True(t, dr.Complete(), "%v", dr.Err())
		require.NotEqual(t, host, owner())
		testwait.Recv(t, done, "the callers ended")
		testwait.For(t, func() bool {
			for _, cl := range clients {
				p, _ := cl.log.snapshot()
				if len(p) < 300 {
					return false
				}
			}
			return true
		}, "every push reaches its client")
		for _, cl := range clients {
			p, closed := cl.log.snapshot()
			require.Equal(t, cl.want, p, "pushes in order, once each")
			require.Empty(t, closed, "no Session closed")
			require.NoError(t, cl.s.Err())
		}
	})
}

func assertNoError(t *testing.T, err error, format string, args ...any) bool {
	t.Helper()
	if err != nil {
		t.Errorf(format+": %v", append(args, err)...)
		return false
	}
	return true
}

// A Session closed by the application reports no error: OnClose gets nil
// and Err stays nil (the bound Actors serve on).
func TestSessionCloseReportsNil(t *testing.T) {
	r := start(t, memstore.New())
	closed := make(chan error, 1)
	s, err := r.OpenSession(roam.SessionOptions{OnClose: func(err error) { closed <- err }})
	require.NoError(t, err)
	_, err = s.SpawnActor(context.Background(), "counter", "bound")
	require.NoError(t, err)
	s.Close()
	select {
	case err := <-closed:
		require.NoError(t, err, "OnClose after Close")
	case <-time.After(testwait.Patience(t)):
		t.Fatal("OnClose was not called after Close")
	}
	require.NoError(t, s.Err())
}
