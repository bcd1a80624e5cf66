package roam_test

// Break-review tests: each one reproduces a way a review broke roam's
// public API (fixed since; the test keeps it fixed) or checks an attack
// that held.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// logBuf is a zerolog sink tests can search.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) logger() zerolog.Logger { return zerolog.New(l).Level(zerolog.InfoLevel) }

// startedCounter counts its Started messages (every restart is one).
type startedCounter struct {
	counter
	started *atomic.Int64
}

func (s *startedCounter) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		s.started.Add(1)
	}
	s.counter.Receive(c)
}

// F1. A kind made with FromClusterKind on a node that is no Proto.Actor
// cluster member: Proto.Actor's cluster middleware calls GetCluster on
// Started, which panics without a cluster; roam's RestartAlways restarts
// the actor, which panics again, forever. Start refuses such a kind.
func TestBreakFromClusterKindWithoutProtoCluster(t *testing.T) {
	ck := pcluster.NewKind("ck", actor.PropsFromProducer(func() actor.Actor { return &counter{} }))
	system := actor.NewActorSystem()
	defer system.Shutdown()
	r, err := roam.New(system, roam.WithStore(memstore.New()), roam.WithLogger(*testlog.Logger()),
		roam.WithKinds(roam.FromClusterKind(ck, roam.PreserveState())))
	require.NoError(t, err)
	require.ErrorIs(t, r.Start(context.Background()), roamerr.ErrNotConfigured, "refused at Start, not a restart loop later")
}

// F2. After the owner lease ended, the in-place rejoin stops the old
// lifecycle's incarnations and relocation actor at once (driver.Shutdown)
// and unsubscribes its dead-letter handling; the new lifecycle subscribes
// only once it has claimed the node again. Until then a one-way send that
// reaches the node for an old incarnation is dead-lettered on the
// application's system with nobody of roam hearing it: no send_dead_letter,
// no send_lease_ended, no metric. The old owned-system mode answered such
// late arrivals for a follow period (retired lifecycle) or shut the remote
// so the sender's driver redelivered them.
func TestBreakRejoinWindowDropsSendsSilently(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	var logs logBuf
	a := start(t, f, roam.WithNodeName("node-a"), roam.WithLogger(logs.logger()))
	b := start(t, store, roam.WithNodeName("node-b"))
	pid, err := a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	lease := leaseOf(t, store, a.NodeRid())

	f.Partition(true)
	testwait.For(t, func() bool {
		alive, err := store.LeaseAlive(ctx, location.LeaseID(lease))
		return err == nil && !alive
	}, "the lease never ended")
	// The store answers again (the node learns its lease is gone), but
	// the new lifecycle's claims fail for a while.
	failClaims(f, 30)
	f.Partition(false)
	// The old lifecycle's relocation actor is gone from the system.
	testwait.For(t, func() bool {
		_, ok := a.System().ProcessRegistry.GetLocal("roam/relocation")
		return !ok
	}, "the old lifecycle was never shut down")
	before := logs.String()
	for i := 0; i < 5; i++ {
		b.System().Root.Send(pid, wrapperspb.String("late"))
	}
	testwait.For(t, func() bool {
		after := strings.TrimPrefix(logs.String(), before)
		return strings.Contains(after, "send_dead_letter") || strings.Contains(after, "send_lease_ended") ||
			strings.Contains(after, "send_unavailable")
	}, "five accepted sends vanished without a loud error")
}

// F3. Start is not retryable: a Start that fails after Attach started the
// remote (a name taken, a store unreachable at boot) shuts that remote
// down, but Proto.Actor keeps it registered on the system, so every later
// Start is refused with NotConfigured ("a remote roam did not configure").
func TestBreakStartIsNotRetryable(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	holder := start(t, store, roam.WithNodeName("taken"))
	system := actor.NewActorSystem()
	defer system.Shutdown()
	r, err := roam.New(system, roam.WithStore(store), roam.WithKinds(counterKind), roam.WithNodeName("taken"), roam.WithLeaseTTL(2e9))
	require.NoError(t, err)
	require.ErrorIs(t, r.Start(ctx), roamerr.ErrAlreadyExists)
	require.NoError(t, holder.Stop(ctx)) // the name is free now
	err = r.Start(ctx)
	defer r.Stop(ctx)
	require.NoError(t, err, "a second Start once the cause is gone")
}

// F4. The default node name is the address. A node on a fixed port that
// crashed (no Stop) keeps its name claimed until its lease ends in the
// store: the restarted process cannot Start for up to a lease TTL (on
// Consul up to twice the TTL), with AlreadyExists — which reads as a
// permanent error (roamerr: "retry may succeed: no"). Before names, a
// restart got a new RID at once.
func TestBreakCrashedFixedPortNodeCannotRestart(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	port := freePort(t)
	sys1 := actor.NewActorSystem()
	r1, err := roam.New(sys1, roam.WithStore(f), roam.WithAddress("127.0.0.1", port), roam.WithLeaseTTL(5e9))
	require.NoError(t, err)
	require.NoError(t, r1.Start(ctx))
	// The process "crashes": cut from the store (no renewal, no release)
	// and its port freed.
	f.Partition(true)
	defer f.Partition(false)
	closeRemote(sys1)
	// The old remote may hold its port a little after Shutdown returns
	// (its listener closes after): restart once the port is free.
	testwait.For(t, func() bool {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	}, "the crashed node's port is free again")

	sys2 := actor.NewActorSystem()
	defer sys2.Shutdown()
	r2, err := roam.New(sys2, roam.WithStore(store), roam.WithAddress("127.0.0.1", port), roam.WithLeaseTTL(5e9))
	require.NoError(t, err)
	err = r2.Start(ctx)
	defer r2.Stop(ctx)
	require.NoError(t, err, "the restarted node (same address, default name) must start")
}

// F5. A user receiver middleware that passes on only the application's
// protobuf messages (a common filter) swallows roam's control messages,
// which run through the user's middleware because the host is innermost:
// here the close marker, so a User Spot's Close never finishes and the
// incarnation stays ended-but-alive.
func TestBreakUserMiddlewareSwallowsCloseMarker(t *testing.T) {
	ctx := context.Background()
	onlyProto := func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			switch env.Message.(type) {
			case proto.Message, actor.AutoReceiveMessage, actor.SystemMessage:
				next(c, env)
			}
		}
	}
	room := roam.NewKind("room", actor.PropsFromProducer(func() actor.Actor { return &counter{} },
		actor.WithReceiverMiddleware(onlyProto)), roam.RecreateOnRelocation())
	r := start(t, memstore.New(), roam.WithKinds(room))
	res, err := r.Spots().GetOrCreate(ctx, "lobby", "room")
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	closed, err := r.Spots().Close(cctx, res.Ref)
	t.Logf("Close: %v %v after %v", closed, err, time.Since(began))
	if err != nil {
		// What is left: the record, and whether the ID can be used again.
		f, rerr := r.Spots().Find(ctx, "lobby")
		t.Logf("after the failed Close: Find = %+v, %v", f, rerr)
		again, gerr := r.Spots().GetOrCreate(ctx, "lobby", "room")
		t.Logf("after the failed Close: GetOrCreate = %+v, %v", again.State, gerr)
	}
	require.NoError(t, err)
	require.True(t, closed)
}

// F6 (held?). PreserveState on an actor that neither calls KeepState nor
// implements Stateful: the move must fail cleanly and the actor keep
// serving at its source.
type plain struct{ n int64 }

func (p *plain) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.StringValue); ok {
		p.n++
		c.Respond(wrapperspb.Int64(p.n))
	}
}

func TestBreakPreserveStateNotStatefulFailsCleanly(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	k := roam.NewKind("plain", actor.PropsFromProducer(func() actor.Actor { return &plain{} }), roam.PreserveState())
	a := start(t, store, roam.WithNodeName("a"), roam.WithKinds(k))
	start(t, store, roam.WithNodeName("b"), roam.WithKinds(k))
	pid, err := a.SpawnActor(ctx, "plain", "p")
	require.NoError(t, err)
	req := func() int64 {
		t.Helper()
		pid, err := a.Resolve(ctx, roam.ActorRef("p"))
		require.NoError(t, err)
		res, err := a.System().Root.RequestFuture(pid, wrapperspb.String("x"), 5*time.Second).Result()
		require.NoError(t, err)
		require.IsType(t, &wrapperspb.Int64Value{}, res, "got %v", res)
		return res.(*wrapperspb.Int64Value).GetValue()
	}
	require.EqualValues(t, 1, req())
	_, err = a.Relocate(ctx, roam.ActorRef("p"), "b")
	require.Error(t, err)
	t.Logf("move error: %v (class %v)", err, roamerr.Class(err))
	require.ErrorIs(t, err, roamerr.ErrTypeMismatch)
	now, err := a.Resolve(ctx, roam.ActorRef("p"))
	require.NoError(t, err)
	require.Equal(t, pid.Address, now.Address, "still at its source")
	require.EqualValues(t, 2, req(), "still serving, state kept")
}

// KeepState outside a relocatable incarnation is InvalidOperation.
func TestBreakKeepStateOutsideIncarnation(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	got := make(chan error, 1)
	pid := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actor.Started); ok {
			got <- roam.KeepState(c, &counter{})
		}
	}))
	defer system.Root.Stop(pid)
	select {
	case err := <-got:
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	case <-time.After(5 * time.Second):
		t.Fatal("no Started")
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	// Below the ephemeral range (consultest.FreePorts says why): the
	// test checks the port is free, then binds it again.
	ports, err := consultest.FreePorts(1)
	require.NoError(t, err)
	return ports[0]
}

// closeRemote frees a system's port as a crash would (the process's
// remote gone), without roam's Stop.
func closeRemote(system *actor.ActorSystem) {
	remote.GetRemote(system).Shutdown(false)
}

// clusterNode starts an application node with a Proto.Actor cluster
// (in-memory provider) and roam attached, as examples/grains does.
func clusterNode(t *testing.T, agent *test.InMemAgent, store location.Store, plain []*pcluster.Kind, opts ...roam.Option) (*roam.Roam, *pcluster.Cluster) {
	t.Helper()
	system := actor.NewActorSystem()
	r, err := roam.New(system, append([]roam.Option{roam.WithStore(store), roam.WithLeaseTTL(2e9)}, opts...)...)
	require.NoError(t, err)
	rc, err := r.RemoteConfig("127.0.0.1", 0)
	require.NoError(t, err)
	c := pcluster.New(system, pcluster.Configure("break", test.NewTestProvider(agent), r.IdentityLookup(), rc, pcluster.WithKinds(plain...)))
	c.StartMember()
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		_ = r.Stop(context.Background())
		if !system.IsStopped() {
			c.Shutdown(true)
		}
	})
	return r, c
}

// initCounter counts the ClusterInit messages it gets.
type initCounter struct {
	counter
	inits *atomic.Int64
}

func (i *initCounter) Receive(c actor.Context) {
	if _, ok := c.Message().(*pcluster.ClusterInit); ok {
		i.inits.Add(1)
	}
	i.counter.Receive(c)
}

// F7. NewKind given the Props of a Proto.Actor cluster kind
// (cluster.NewKind(...).Props, what a generated grain's NewXKind returns)
// instead of FromClusterKind: on a cluster member the grain gets
// ClusterInit twice — roam's host delivers one after Started and
// Proto.Actor's middleware another — so a generated grain's Init runs twice.
func TestBreakClusterInitTwiceWithClusterProps(t *testing.T) {
	ctx := context.Background()
	var inits atomic.Int64
	ck := pcluster.NewKind("twice", actor.PropsFromProducer(func() actor.Actor { return &initCounter{inits: &inits} }))
	r, _ := clusterNode(t, test.NewInMemAgent(), memstore.New(), nil,
		roam.WithKinds(roam.NewKind("twice", ck.Props, roam.PreserveState(), roam.Instance())))
	pid, err := r.SpawnActor(ctx, "twice", "g")
	require.NoError(t, err)
	// A ClusterInit comes in the turn of Started; a request's answer comes
	// after that turn.
	_, err = r.System().Root.RequestFuture(pid, wrapperspb.String("tick"), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, inits.Load(), "ClusterInit delivered %d times", inits.Load())
}

// F8. A plain Proto.Actor kind on one node and a roam Instance kind of the
// same name on another: the plain node's IdentityLookup takes the kind for
// roam's as soon as it reads the other node's descriptor, so its own calls
// stop reaching its Proto.Actor grain (activated through disthash) and a
// second activation of the same identity appears on the roam node —
// silently, with no log naming the clash.
type named struct{ who string }

func (n named) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.StringValue); ok {
		c.Respond(wrapperspb.String(n.who))
	}
}

func TestBreakKindNameClashSwitchesLookupSilently(t *testing.T) {
	ctx := context.Background()
	agent := test.NewInMemAgent()
	store := memstore.New()
	var logs logBuf
	_, ca := clusterNode(t, agent, store, []*pcluster.Kind{pcluster.NewKind("dup", actor.PropsFromProducer(func() actor.Actor { return named{"plain"} }))},
		roam.WithLogger(logs.logger()))
	call := func(id string) string {
		t.Helper()
		res, err := ca.Request(id, "dup", wrapperspb.String("?"), pcluster.WithTimeout(5*time.Second))
		require.NoError(t, err)
		return res.(*wrapperspb.StringValue).GetValue()
	}
	require.Equal(t, "plain", call("i1"))
	clusterNode(t, agent, store, nil, roam.WithKinds(roam.NewKind("dup", actor.PropsFromProducer(func() actor.Actor { return named{"roam"} }), roam.RecreateOnRelocation(), roam.Instance())))
	_ = ctx
	// New identities stay Proto.Actor's, also once this node's lookup has
	// seen the other node's roam kind of that name (and said so).
	probe := 0
	testwait.For(t, func() bool {
		probe++
		require.Equal(t, "plain", call(fmt.Sprint("probe-", probe)))
		return strings.Contains(logs.String(), "kind_name_clash")
	}, "the lookup never saw the other node's roam kind")
	require.Equal(t, "plain", call("i1"))
	require.Equal(t, "plain", call("i2"), "a kind this node registers with Proto.Actor (and not with roam) was taken for roam's")
}

// descOf is the live node rid's descriptor.
func descOf(t *testing.T, store location.Store, rid string) *location.NodeDescriptor {
	t.Helper()
	nodes, err := store.ListNodes(context.Background(), "")
	require.NoError(t, err)
	for _, n := range nodes {
		if n.Node.GetNodeRid() == rid {
			return n.Node
		}
	}
	t.Fatalf("no node %s", rid)
	return nil
}

// relocateRequest sends a RelocateRequest from from's system to the
// relocation actor at address, naming requester, and returns the reply.
func relocateRequest(t *testing.T, from *roam.Roam, address string, requester *location.NodeDescriptor, kind messages.AuthorityKind, id, target string, deadline int64) any {
	t.Helper()
	req := &messages.RelocateRequest{Kind: kind, Id: id, TargetRid: target, DeadlineUnixMillis: deadline}
	if requester != nil {
		req.Requester = &messages.NodeRef{NodeRid: requester.GetNodeRid(), NodeGeneration: requester.GetNodeGeneration(), Address: requester.GetAddress()}
	}
	res, err := from.System().Root.RequestFuture(actor.NewPID(address, "roam/relocation"), req, 10*time.Second).Result()
	require.NoError(t, err)
	return res
}

// Forwarded Relocate, attacked from a member and from outside.
func TestBreakForwardedRelocateRequests(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("a"))
	b := start(t, store, roam.WithNodeName("b"))
	bd := descOf(t, store, b.NodeRid())
	_, err := a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	addrA := a.System().Address()
	code := func(res any) string {
		r, ok := res.(*messages.RelocateReply)
		require.True(t, ok, "reply %T", res)
		t.Logf("reply: %q %s", r.GetCode(), r.GetDetail())
		return r.GetCode()
	}

	// A User Spot moves by roam's own API (to b), and back by a member's
	// forwarded request (a asks b, its owner now).
	var club roam.SpotRef
	for i := 0; ; i++ {
		res, err := a.Spots().GetOrCreate(ctx, "club"+string(rune('a'+i)), "counter")
		require.NoError(t, err)
		if res.Ref.NodeRid == a.NodeRid() {
			club = res.Ref
			break
		}
		require.Less(t, i, 20)
	}
	_, err = b.Relocate(ctx, location.Key(location.KindUserSpot, club.SpotID), "b")
	require.NoError(t, err)
	ad := descOf(t, store, a.NodeRid())
	require.Empty(t, code(relocateRequest(t, a, b.System().Address(), ad, messages.AuthorityKind_AUTHORITY_KIND_USER_SPOT, club.SpotID, a.NodeRid(), 0)))
	after, err := a.Spots().Find(ctx, club.SpotID)
	require.NoError(t, err)
	require.Equal(t, a.NodeRid(), after.NodeRid)

	// Entry Spot, unknown kind, deadline in the past: refused.
	require.NotEmpty(t, code(relocateRequest(t, b, addrA, bd, messages.AuthorityKind_AUTHORITY_KIND_ENTRY, ad.GetEntrySpotId(), b.NodeRid(), 0)))
	require.NotEmpty(t, code(relocateRequest(t, b, addrA, bd, messages.AuthorityKind(99), "x", b.NodeRid(), 0)))
	// A deadline long past: refused before anything (its class is
	// Unavailable — the store read fails on the expired context — not
	// DeadlineExceeded; noted in the report).
	require.Contains(t, []string{roamerr.CodeDeadlineExceeded, roamerr.CodeUnavailable}, code(relocateRequest(t, b, addrA, bd, messages.AuthorityKind_AUTHORITY_KIND_ACTOR, "x", b.NodeRid(), 1)))

	// From outside: a process that is no node, naming b as requester.
	outsider := actor.NewActorSystem()
	defer outsider.Shutdown()
	ro, err := roam.New(outsider, roam.WithStore(memstore.New())) // only for its System(); never started
	require.NoError(t, err)
	rem := remote.NewRemote(outsider, remote.Configure("127.0.0.1", 0))
	rem.Start()
	defer rem.Shutdown(false)
	require.Equal(t, roamerr.CodePermissionDenied, code(relocateRequest(t, ro, addrA, bd, messages.AuthorityKind_AUTHORITY_KIND_ACTOR, "x", b.NodeRid(), 0)))
	pid, err := a.Resolve(ctx, roam.ActorRef("x"))
	require.NoError(t, err)
	require.Equal(t, addrA, pid.Address, "x did not move")

	// A flood from a member for an object a does not own: every one answered.
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &messages.RelocateRequest{Kind: messages.AuthorityKind_AUTHORITY_KIND_ACTOR, Id: "nobody", TargetRid: b.NodeRid(),
				Requester: &messages.NodeRef{NodeRid: bd.GetNodeRid(), NodeGeneration: bd.GetNodeGeneration(), Address: bd.GetAddress()}}
			res, err := b.System().Root.RequestFuture(actor.NewPID(addrA, "roam/relocation"), req, 20*time.Second).Result()
			if err == nil {
				if r, ok := res.(*messages.RelocateReply); ok && r.GetCode() == roamerr.CodeNotFound {
					answered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 300, answered.Load())
}

// cutUntilLeaseEnds partitions f until the store ended rid's lease.
func cutUntilLeaseEnds(t *testing.T, f *faulty.Store, store location.Store, rid string) {
	t.Helper()
	lease := leaseOf(t, store, rid)
	require.NotEmpty(t, lease)
	f.Partition(true)
	testwait.For(t, func() bool {
		alive, err := store.LeaseAlive(context.Background(), location.LeaseID(lease))
		return err == nil && !alive
	}, "the store never ended the lease")
}

// rejoinAfterLeaseEnds cuts a's store off until its lease ends, heals the
// cut, and waits for a to serve again as a new lifecycle (a new RID, its
// relocation actor running).
func rejoinAfterLeaseEnds(t *testing.T, a *roam.Roam, f *faulty.Store, store location.Store) {
	t.Helper()
	old := a.NodeRid()
	cutUntilLeaseEnds(t, f, store, old)
	f.Partition(false)
	testwait.For(t, func() bool { return a.NodeRid() != old && a.NodeRid() != "" }, "no rejoin")
	testwait.For(t, func() bool {
		_, ok := a.System().ProcessRegistry.GetLocal("roam/relocation")
		return ok
	}, "no relocation actor after the rejoin")
}

// Stop while the rejoin cannot claim (store still cut): how long?
func TestBreakStopDuringRejoin(t *testing.T) {
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	a := start(t, f, roam.WithNodeName("a"))
	cutUntilLeaseEnds(t, f, store, a.NodeRid())
	// The rejoin's claims keep failing until the test ends: a Stop that
	// waited for the rejoin would never return.
	failClaims(f, 10_000)
	f.Partition(false)
	testwait.For(t, func() bool {
		_, ok := a.System().ProcessRegistry.GetLocal("roam/relocation")
		return !ok
	}, "the old lifecycle was never shut down")
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(context.Background()) }()
	var stopErr error
	testwait.For(t, func() bool {
		select {
		case stopErr = <-stopped:
			return true
		default:
			return false
		}
	}, "Stop blocked on the rejoin's claim")
	t.Logf("Stop during the rejoin: %v", stopErr)
	testwait.For(t, func() bool {
		nodes, err := store.ListNodes(context.Background(), "")
		return err == nil && len(nodes) == 0
	}, "a stopped roam left a claim behind")
}

// Two rejoins in a row; the node serves after each, its name kept.
func TestBreakSecondRejoin(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	a := start(t, f, roam.WithNodeName("a"))
	b := start(t, store, roam.WithNodeName("b"))
	for round := 0; round < 2; round++ {
		rejoinAfterLeaseEnds(t, a, f, store)
		id := "r" + string(rune('0'+round))
		_, err := a.SpawnActor(ctx, "counter", id)
		require.NoError(t, err, "round %d", round)
		// On a loaded machine a renewal can come later than the fence (a
		// TTL of 2 s): a move then fails Unavailable until the next proof.
		relocate := func(target string) (roam.Outcome, error) { return b.Relocate(ctx, roam.ActorRef(id), target) }
		_, err = testwait.Past(t, roamerr.ErrUnavailable, func() (roam.Outcome, error) { return relocate("b") })
		require.NoError(t, err, "round %d", round)
		_, err = testwait.Past(t, roamerr.ErrUnavailable, func() (roam.Outcome, error) { return relocate("a") })
		require.NoError(t, err, "round %d", round)
		require.Equal(t, "a", a.NodeName())
	}
}

// failClaims makes the next n node claims through f fail Unavailable.
func failClaims(f *faulty.Store, n int) {
	for i := 0; i < n; i++ {
		f.InjectOn("claim node", faulty.Unavailable)
	}
}

// F-minor. A node may take another live node's RID as its name; Relocate
// resolves names first, so a move "to that RID" goes to the impostor.
func TestBreakNameEqualToAnotherNodesRID(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("a"))
	b := start(t, store, roam.WithNodeName("b"))
	start(t, store, roam.WithNodeName(b.NodeRid())) // c
	_, err := a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	out, err := a.Relocate(ctx, roam.ActorRef("x"), b.NodeRid())
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), out.To, "the move named b's RID")
}

// Lifecycle misuse of the public API.
func TestBreakLifecycleMisuse(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()

	// Stop before Start, then Start: refused (the message says "started
	// already", which it was not).
	system := actor.NewActorSystem()
	defer system.Shutdown()
	r, err := roam.New(system, roam.WithStore(store))
	require.NoError(t, err)
	require.NoError(t, r.Stop(ctx))
	err = r.Start(ctx)
	t.Logf("Start after Stop: %v", err)
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	_, err = r.Spots().Request(ctx, "x", wrapperspb.String("hi"))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	_, err = r.Relocate(ctx, roam.ActorRef("x"), "y")
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	require.Equal(t, "", r.NodeName())

	// A system whose remote the application started with roam's own
	// RemoteConfig (no Proto.Actor cluster): refused as "a remote roam did
	// not configure".
	sys2 := actor.NewActorSystem()
	defer sys2.Shutdown()
	r2, err := roam.New(sys2, roam.WithStore(store))
	require.NoError(t, err)
	rc, err := r2.RemoteConfig("127.0.0.1", 0)
	require.NoError(t, err)
	rem := remote.NewRemote(sys2, rc)
	rem.Start()
	defer rem.Shutdown(false)
	err = r2.Start(ctx)
	t.Logf("Start on a bare remote configured by roam: %v", err)
	if err == nil {
		_ = r2.Stop(ctx)
	}

	// Stop twice; concurrent Stops.
	r3 := start(t, store)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r3.Stop(ctx) }()
	}
	wg.Wait()
	require.NoError(t, r3.Stop(ctx))
}

// In-place rejoin of a Proto.Actor cluster member: grain calls through
// cluster.Request work again on the new lifecycle, from both nodes.
func TestBreakRejoinOfAClusterMember(t *testing.T) {
	ctx := context.Background()
	agent := test.NewInMemAgent()
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	kind := roam.NewKind("tk", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState(), roam.Instance())
	a, ca := clusterNode(t, agent, f, nil, roam.WithKinds(kind), roam.WithNodeName("a"))
	b, cb := clusterNode(t, agent, store, nil, roam.WithKinds(kind), roam.WithNodeName("b"))
	call := func(c *pcluster.Cluster, id string) (int64, error) {
		res, err := c.Request(id, "tk", wrapperspb.String("t"), pcluster.WithTimeout(5*time.Second))
		if err != nil {
			return 0, err
		}
		v, ok := res.(*wrapperspb.Int64Value)
		if !ok {
			return 0, fmt.Errorf("reply %T %v", res, res)
		}
		return v.GetValue(), nil
	}
	// A grain on a.
	var onA string
	for i := 0; onA == ""; i++ {
		id := fmt.Sprintf("g%d", i)
		_, err := call(cb, id)
		require.NoError(t, err)
		ref, err := b.Spots().Find(ctx, spot.GrainSpotID("tk", id))
		require.NoError(t, err)
		if ref.NodeRid == a.NodeRid() {
			onA = id
		}
		require.Less(t, i, 30)
	}
	rejoinAfterLeaseEnds(t, a, f, store)

	// New grains from both nodes.
	for i := 0; i < 6; i++ {
		for _, c := range []*pcluster.Cluster{ca, cb} {
			id := fmt.Sprintf("n%d-%p", i, c)
			n, err := call(c, id)
			require.NoError(t, err, "grain %s after the rejoin", id)
			require.EqualValues(t, 1, n)
		}
	}
	// The grain the old lifecycle owned comes back by itself, from its
	// last checkpoint (PreserveState checkpoints by default); no operator
	// is needed, and there is no loss to accept.
	_, err = b.ReleaseEnded(ctx, roam.InstanceSpotRef(spot.GrainSpotID("tk", onA)))
	require.Error(t, err, "the old lifecycle's grain is not released while it is recovered by itself")
	var n int64
	testwait.For(t, func() bool {
		n, err = call(ca, onA)
		return err == nil
	}, "the old lifecycle's grain never answered again")
	require.GreaterOrEqual(t, n, int64(1), "activated again (from its checkpoint if one was taken before the cut)")
}

// panicky fails in Started, every time (a bug in the application's
// start-up, a restore-time dependency that is down).
type panicky struct {
	started *atomic.Int64
	first   *atomic.Int64 // unix nanoseconds of the first start
	fourth  *atomic.Int64 // and of the fourth
}

func (p *panicky) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		switch p.started.Add(1) {
		case 1:
			p.first.Store(time.Now().UnixNano())
		case 4:
			p.fourth.Store(time.Now().UnixNano())
		}
		panic("start-up failed")
	}
}

// F1b. The general case of F1: a relocatable actor whose Started panics
// was restarted by RestartAlways without back-off, forever (roam refuses
// the stop Proto.Actor's default strategy would make after 10 failures):
// a hot loop that burns a core and floods the log, and the spawn reports
// success.
func TestBreakStartedPanicHotLoops(t *testing.T) {
	ctx := context.Background()
	var started, first, fourth atomic.Int64
	k := roam.NewKind("panicky", actor.PropsFromProducer(func() actor.Actor {
		return &panicky{started: &started, first: &first, fourth: &fourth}
	}), roam.RecreateOnRelocation())
	r := start(t, memstore.New(), roam.WithKinds(k))
	_, err := r.SpawnActor(ctx, "panicky", "p")
	require.NoError(t, err)
	testwait.For(t, func() bool { return started.Load() >= 4 }, "the actor was not restarted")
	// The back-off waits 10 ms more after each failure in a row: at least
	// 10 + 20 + 30 ms between the first start and the fourth. A lower
	// bound only: a busy machine makes the gap longer, never shorter.
	gap := time.Duration(fourth.Load() - first.Load())
	require.GreaterOrEqual(t, gap, 60*time.Millisecond, "restarted without back-off")
}

// F-minor. A forwarded RelocateRequest must be judged as roam's own
// Relocate judges it: a User Spot moves either way (PerActor), and an
// Entry Spot is InvalidOperation either way.
func TestBreakForwardedUserSpotMoveClass(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("a"))
	b := start(t, store, roam.WithNodeName("b"))
	var club roam.SpotRef
	for i := 0; ; i++ {
		res, err := a.Spots().GetOrCreate(ctx, fmt.Sprintf("club%d", i), "counter")
		require.NoError(t, err)
		if res.Ref.NodeRid == a.NodeRid() {
			club = res.Ref
			break
		}
		require.Less(t, i, 20)
	}
	bd := descOf(t, store, b.NodeRid())
	res := relocateRequest(t, b, a.System().Address(), bd, messages.AuthorityKind_AUTHORITY_KIND_USER_SPOT, club.SpotID, b.NodeRid(), 0)
	require.Empty(t, res.(*messages.RelocateReply).GetCode(), "%v", res)
	after, err := a.Spots().Find(ctx, club.SpotID)
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), after.NodeRid)

	entry := descOf(t, store, a.NodeRid()).GetEntrySpotId()
	res = relocateRequest(t, b, a.System().Address(), bd, messages.AuthorityKind_AUTHORITY_KIND_ENTRY, entry, b.NodeRid(), 0)
	require.Equal(t, roamerr.CodeInvalidOperation, res.(*messages.RelocateReply).GetCode(), "%v", res)
	_, err = b.Relocate(ctx, location.Key(location.KindEntry, entry), "b")
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
}

// box is state an actor registers with KeepState.
type box struct{ n int64 }

func (b *box) CaptureState() ([]byte, error) { return proto.Marshal(wrapperspb.Int64(b.n)) }
func (b *box) RestoreState(p []byte) error {
	var v wrapperspb.Int64Value
	err := proto.Unmarshal(p, &v)
	b.n = v.GetValue()
	return err
}

// lazy registers its box on "reg", counts on "inc", panics on "boom".
type lazy struct{ b box }

func (l *lazy) CaptureState() ([]byte, error) { return l.b.CaptureState() }
func (l *lazy) RestoreState(p []byte) error   { return l.b.RestoreState(p) }
func (l *lazy) Receive(c actor.Context) {
	s, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		return
	}
	switch s.GetValue() {
	case "reg":
		_ = roam.KeepState(c, &l.b)
	case "boom":
		panic("boom")
	case "inc":
		l.b.n++
	}
	c.Respond(wrapperspb.Int64(l.b.n))
}

// F-minor. KeepState's registration outlives a supervisor restart: the
// new instance (Started again) is not what the registration points at, so
// a later move carries the crashed instance's state, not the live one.
func TestBreakKeepStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	k := roam.NewKind("lazy", actor.PropsFromProducer(func() actor.Actor { return &lazy{} }), roam.PreserveState())
	a := start(t, store, roam.WithNodeName("a"), roam.WithKinds(k))
	start(t, store, roam.WithNodeName("b"), roam.WithKinds(k))
	_, err := a.SpawnActor(ctx, "lazy", "l")
	require.NoError(t, err)
	pidOf := func() *actor.PID {
		t.Helper()
		pid, err := a.Resolve(ctx, roam.ActorRef("l"))
		require.NoError(t, err)
		return pid
	}
	send := func(v string) int64 {
		t.Helper()
		res, err := a.System().Root.RequestFuture(pidOf(), wrapperspb.String(v), testwait.Patience(t)).Result()
		require.NoError(t, err)
		return res.(*wrapperspb.Int64Value).GetValue()
	}
	send("reg")
	send("inc")
	send("inc")
	require.EqualValues(t, 3, send("inc"))
	// Restart: a new instance, count 0, not registered. A send, not a
	// request: the panicking turn answers nothing, and the next message
	// is handled after the restart.
	a.System().Root.Send(pidOf(), wrapperspb.String("boom"))
	require.EqualValues(t, 1, send("inc"), "the restarted instance starts empty")
	_, err = a.Relocate(ctx, roam.ActorRef("l"), "b")
	require.NoError(t, err)
	require.EqualValues(t, 2, send("inc"), "the move carries the live instance's state")
}

// F-cluster-shutdown. The application shuts its Proto.Actor cluster member
// down (cluster.Shutdown: the remote and the actor system stop) without
// roam.Stop first — the order examples/grains takes care to avoid. roam
// does not notice: the node keeps renewing its owner lease with a dead
// remote, so its objects are neither reachable nor recovered by another
// node for as long as the process lives.
func TestBreakClusterShutdownWithoutRoamStop(t *testing.T) {
	ctx := context.Background()
	agent := test.NewInMemAgent()
	store := memstore.New()
	kind := roam.NewKind("tk", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.RecreateOnRelocation(), roam.Instance())
	a, ca := clusterNode(t, agent, store, nil, roam.WithKinds(kind), roam.WithNodeName("a"))
	b, _ := clusterNode(t, agent, store, nil, roam.WithKinds(kind), roam.WithNodeName("b"))
	_, err := a.SpawnActor(ctx, "tk", "x")
	require.NoError(t, err)
	// The application's shutdown path, roam not stopped. Graceful, as
	// an application shuts a member down: Shutdown(false) would leave a
	// in the provider's membership, and b's remote would then spend its
	// own shutdown reconnecting to a's (Proto.Actor's endpoint writer
	// retries every 2 s, and the remote's stop waits up to 10 s for it).
	ca.Shutdown(true)
	testwait.For(t, func() bool {
		nodes, err := b.Nodes(ctx)
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == "a" {
				return false
			}
		}
		return true
	}, "node a, whose remote and system are shut, still holds its lease")
}

// A remote configuration changed, after RemoteConfig made it, to listen
// beyond loopback without TLS is refused at Start, as it would have been
// at RemoteConfig.
func TestBreakARemoteConfigWidenedAfterwardsIsRefused(t *testing.T) {
	system := actor.NewActorSystem()
	r, err := roam.New(system, roam.WithStore(memstore.New()))
	require.NoError(t, err)
	rc, err := r.RemoteConfig("127.0.0.1", 0)
	require.NoError(t, err)
	rc.Host = "0.0.0.0"
	c := pcluster.New(system, pcluster.Configure("widened", test.NewTestProvider(test.NewInMemAgent()), r.IdentityLookup(), rc))
	c.StartMember()
	t.Cleanup(func() { c.Shutdown(true) })
	require.ErrorIs(t, r.Start(context.Background()), location.ErrInvalid)
}
