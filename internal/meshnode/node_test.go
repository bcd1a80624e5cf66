package meshnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

var consul *consultest.Server

func TestMain(m *testing.M) {
	consultest.Main(m, func(s *consultest.Server) { consul = s })
}

var prefixes atomic.Int64

type storeCase struct {
	name string
	new  func(t *testing.T) location.Store
}

func stores() []storeCase {
	return []storeCase{
		{"memstore", func(t *testing.T) location.Store { return memstore.New() }},
		{"consul", func(t *testing.T) location.Store {
			s, err := consulstore.New(consulstore.Config{Address: consul.Addr, Prefix: fmt.Sprintf("roam-cluster-test/%d", prefixes.Add(1))})
			require.NoError(t, err)
			return s
		}},
	}
}

var entryIDPattern = regexp.MustCompile(`^roam-entry-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func start(t *testing.T, s location.Store) *meshnode.Node {
	t.Helper()
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: s, StableTypes: []string{"room"}, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	return n
}

// echo answers every NodeDescriptor request with itself.
type echo struct{}

func (echo) Receive(c actor.Context) {
	if m, ok := c.Message().(*messages.NodeDescriptor); ok {
		c.Respond(m)
	}
}

// Three nodes claim distinct descriptors and Entry Spots
// ("<prefix>-entry-<uuid v4>"), reach each other over Proto.Actor remote,
// and leave nothing behind when they stop.
// Reference: docs/PROTOCOL.md §3.4.
func TestNodesClaimEntrySpotsAndRelease(t *testing.T) {
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.new(t)
			ctx := context.Background()
			nodes := []*meshnode.Node{start(t, s), start(t, s), start(t, s)}

			listed, err := s.ListNodes(ctx, meshnode.DefaultMesh)
			require.NoError(t, err)
			require.Len(t, listed, 3)
			seen := map[string]bool{}
			for _, n := range nodes {
				require.Regexp(t, entryIDPattern, n.EntrySpotID())
				require.False(t, seen[n.EntrySpotID()], "entry IDs are unique")
				seen[n.EntrySpotID()] = true
				got, err := s.ReadNode(ctx, location.NodeKeyOf(n.Descriptor()))
				require.NoError(t, err)
				require.Equal(t, n.Address(), got.Node.GetAddress())
				require.Equal(t, string(n.Lease().ID), got.Node.GetLeaseId())
				require.Equal(t, messages.NodeStatus_NODE_STATUS_SERVING, got.Node.GetStatus())
				entry, err := s.Read(ctx, location.Key(location.KindEntry, n.EntrySpotID()))
				require.NoError(t, err)
				require.Equal(t, n.Descriptor().GetNodeRid(), entry.Record.GetOwner().GetNodeRid())
				_, port, err := net.SplitHostPort(n.Address())
				require.NoError(t, err)
				require.NotEqual(t, "0", port)
			}

			// Node 0 reaches an actor on node 2 through the remote.
			_, err = nodes[2].System().Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return echo{} }), "echo")
			require.NoError(t, err)
			target := actor.NewPID(nodes[2].Address(), "echo")
			res, err := nodes[0].System().Root.RequestFuture(target, nodes[0].Descriptor(), 10*time.Second).Result()
			require.NoError(t, err)
			require.Equal(t, nodes[0].EntrySpotID(), res.(*messages.NodeDescriptor).GetEntrySpotId())

			for _, n := range nodes {
				require.NoError(t, n.Stop(ctx))
				_, err := s.ReadNode(ctx, location.NodeKeyOf(n.Descriptor()))
				require.ErrorIs(t, err, location.ErrNotFound)
				_, err = s.Read(ctx, location.Key(location.KindEntry, n.EntrySpotID()))
				require.ErrorIs(t, err, location.ErrNotFound)
				alive, err := s.LeaseAlive(ctx, n.Lease().ID)
				require.NoError(t, err)
				require.False(t, alive)
			}
			require.NoError(t, nodes[0].Stop(ctx), "Stop is idempotent")
		})
	}
}

// A restart is a new lifecycle: new node RID, new Entry Spot ID.
// Reference: PROTOCOL.md §2.2 (every start is a new lifecycle), §3.4.
func TestRestartIssuesNewIdentity(t *testing.T) {
	s := memstore.New()
	a := start(t, s)
	require.NoError(t, a.Stop(context.Background()))
	b := start(t, s)
	require.NotEqual(t, a.EntrySpotID(), b.EntrySpotID())
	require.NotEqual(t, a.Descriptor().GetNodeRid(), b.Descriptor().GetNodeRid())
	require.NotEqual(t, a.Descriptor().GetNodeGeneration(), b.Descriptor().GetNodeGeneration())
}

// The node keeps its lease alive by renewing it.
// Reference: PROTOCOL.md §3.4 (claims under an owner lease).
func TestNodeRenewsItsLease(t *testing.T) {
	clock := memstore.NewManualClock()
	s := memstore.New(memstore.WithClock(clock))
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: s, LeaseTTL: time.Second})
	require.NoError(t, err)
	defer n.Stop(context.Background())
	// Move the store's clock by less than a TTL at a time, each time only
	// after the node has renewed at the new store time; without renewals
	// the second step would already pass the TTL.
	for i := 0; i < 5; i++ {
		clock.Advance(700 * time.Millisecond)
		want := clock.Now().Add(time.Second)
		deadline := time.Now().Add(testwait.Patience(t))
		for {
			exp, ok := s.LeaseExpiry(n.Lease().ID)
			require.True(t, ok, "lease ended")
			if exp.Equal(want) {
				break
			}
			require.True(t, time.Now().Before(deadline), "no renewal after step %d", i)
			time.Sleep(20 * time.Millisecond)
		}
	}
	alive, err := s.LeaseAlive(context.Background(), n.Lease().ID)
	require.NoError(t, err)
	require.True(t, alive)
}

// When the store says the lease ended, the node reports it and its claim is
// gone; Stop then succeeds without releasing anything.
// Reference: PROTOCOL.md §2.2 (an ended lifecycle); docs/FAULTS.md.
func TestNodeReportsLostLease(t *testing.T) {
	clock := memstore.NewManualClock()
	s := memstore.New(memstore.WithClock(clock))
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: s, LeaseTTL: time.Second})
	require.NoError(t, err)
	clock.Advance(5 * time.Second)
	select {
	case <-n.LeaseLost():
	case <-time.After(30 * time.Second):
		t.Fatal("lease loss not reported")
	}
	_, err = s.ReadNode(context.Background(), location.NodeKeyOf(n.Descriptor()))
	require.ErrorIs(t, err, location.ErrNotFound)
	require.NoError(t, n.Stop(context.Background()))
}

// A claim the store cannot make fails Start with the store's typed error
// and leaves no remote listening.
// Reference: PROTOCOL.md §3.4 (a start-up error at the first claim).
func TestStartFailsWhenClaimFails(t *testing.T) {
	f, err := faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())

	// A store that stays unavailable for the start's context.
	for range 1000 {
		f.Inject(faulty.Unavailable)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = meshnode.Start(short, meshnode.Config{Store: f, Port: port})
	require.ErrorIs(t, err, location.ErrUnavailable)
	f, err = faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	// The failed start released its port: the next start binds it.
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: f, Port: port})
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", port), n.Address())
	require.NoError(t, n.Stop(context.Background()))

	_, err = meshnode.Start(context.Background(), meshnode.Config{})
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), EntryPrefix: "x-entry-y"})
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), LeaseTTL: 1500 * time.Millisecond})
	require.True(t, errors.Is(err, location.ErrInvalid))
}

// A claim the store refuses for a moment, or whose outcome it cannot
// tell (a Consul agent just after a leader election), is retried within
// the start's context, under a new identity each time; a claim that was
// applied after all gives its name back, so the node keeps it.
func TestStartRetriesATransientlyRefusedClaim(t *testing.T) {
	f, err := faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	f.InjectOn("claim node", faulty.Unavailable, faulty.IndeterminateApplied, faulty.IndeterminateLost)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: f, Name: "n1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	require.Equal(t, "n1", n.Name())
	nodes, err := f.ListNodes(context.Background(), meshnode.DefaultMesh)
	require.NoError(t, err)
	require.Len(t, nodes, 1, "the applied claim was given back")
	require.Equal(t, n.Descriptor().GetNodeRid(), nodes[0].Node.GetNodeRid())
}

// A node started with a Consul server that is still electing its leader
// (and then does not yet take sessions) starts once it does.
func TestStartDuringAConsulElection(t *testing.T) {
	fresh := consultest.StartWith(t, consultest.Options{Unready: true})
	s, err := consulstore.New(consulstore.Config{Address: fresh.Addr, Prefix: "roam-election-test"})
	require.NoError(t, err)
	var out bytes.Buffer
	log := zerolog.New(&out)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: s, Logger: &log})
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "node_claim_retry", "the claim met the election")
	require.NoError(t, n.Stop(context.Background()))
}

// A node that would listen beyond loopback without TLS does not start
// unless the application accepts plain TCP; on loopback it needs nothing.
func TestPlainTCPBeyondLoopbackNeedsConsent(t *testing.T) {
	_, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Host: "0.0.0.0"})
	require.ErrorIs(t, err, location.ErrInvalid)
	require.ErrorContains(t, err, "WithTLS")
	require.ErrorContains(t, err, "WithPlainTCP")
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Host: "0.0.0.0", PlainTCP: true})
	require.NoError(t, err)
	require.NoError(t, n.Stop(context.Background()))
	for _, host := range []string{"127.0.0.1", "localhost"} {
		n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), Host: host})
		require.NoError(t, err, host)
		require.NoError(t, n.Stop(context.Background()))
	}
}

// A claim applied although the store said it could not tell, which the
// store then cannot release at once either, holds the node's name: the
// start releases it when the store answers again and keeps the name.
func TestStartReleasesItsOwnOrphanedClaim(t *testing.T) {
	f, err := faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	f.InjectOn("claim node", faulty.IndeterminateApplied)
	f.InjectOn("read node", faulty.Unavailable)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: f, Name: "n1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	nodes, err := f.ListNodes(context.Background(), meshnode.DefaultMesh)
	require.NoError(t, err)
	require.Len(t, nodes, 1, "the orphaned claim was released")
	require.Equal(t, n.Descriptor().GetNodeRid(), nodes[0].Node.GetNodeRid())
}

// stuckRenewals is a store whose renewals wait until their context ends,
// as a store that does not answer; it records how each one ended.
type stuckRenewals struct {
	location.Store
	inFlight atomic.Int32
	mu       sync.Mutex
	ended    []error
}

func (s *stuckRenewals) RenewLease(ctx context.Context, id location.LeaseID) error {
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	<-ctx.Done()
	s.mu.Lock()
	s.ended = append(s.ended, ctx.Err())
	s.mu.Unlock()
	return fmt.Errorf("%w: renew %s: %w", location.ErrUnavailable, id, ctx.Err())
}

func (s *stuckRenewals) lastEnded() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ended) == 0 {
		return nil
	}
	return s.ended[len(s.ended)-1]
}

// Stop ends the renewal in flight and returns once it has: no goroutine
// of the node goes on waiting on the store under the renewal's own
// timeout after the node stopped.
func TestStopEndsTheRenewalInFlight(t *testing.T) {
	s := &stuckRenewals{Store: memstore.New()}
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: s, LeaseTTL: 6 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	testwait.For(t, func() bool { return s.inFlight.Load() > 0 }, "the node never renewed its lease")
	require.NoError(t, n.Stop(context.Background()))
	require.Zero(t, s.inFlight.Load(), "a renewal is still waiting on the store after Stop returned")
	require.ErrorIs(t, s.lastEnded(), context.Canceled, "the renewal ran to its own timeout instead of ending with the node")
}
