package consulstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
)

// The agent addresses are checked: Address or Addresses, each host:port
// (an http or https scheme allowed), none twice.
func TestAgentAddressesAreChecked(t *testing.T) {
	for _, cfg := range []consulstore.Config{
		{Address: "127.0.0.1:8500", Addresses: []string{"127.0.0.1:8501"}},
		{Addresses: []string{"127.0.0.1:8500", ""}},
		{Addresses: []string{"127.0.0.1"}},
		{Addresses: []string{":8500"}},
		{Addresses: []string{"ftp://127.0.0.1:8500"}},
		{Addresses: []string{"127.0.0.1:8500", "127.0.0.1:8500"}},
	} {
		_, err := consulstore.New(cfg)
		require.ErrorIs(t, err, location.ErrInvalid, "%+v", cfg)
	}
	for _, cfg := range []consulstore.Config{
		{},
		{Address: "127.0.0.1:8500"},
		{Addresses: []string{"127.0.0.1:8500", "http://127.0.0.1:8501", "https://consul.example:8501"}},
	} {
		_, err := consulstore.New(cfg)
		require.NoError(t, err, "%+v", cfg)
	}
}

// closedAddr is a loopback address nobody listens on: a connection to it
// is refused.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// hangUp is an agent address that takes every request and closes the
// connection without an answer, as an agent dying mid-request does.
func hangUp(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// A call that finds the first agent gone (connection refused) is made
// through the next one, writes too: their request never left.
func TestARefusedAgentIsSkipped(t *testing.T) {
	prefix := fmt.Sprintf("roam-test/agents-%d", prefixes.Add(1))
	s, err := consulstore.New(consulstore.Config{Addresses: []string{closedAddr(t), server.Addr}, Prefix: prefix})
	require.NoError(t, err)
	ctx := context.Background()
	key := location.Key(location.KindActor, "refused")
	v, err := s.CompareAndSet(ctx, key, 0, record(1, 0))
	require.NoError(t, err)
	got, err := s.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version)
}

// A write whose agent hung up after taking the request is Indeterminate
// and is not sent again through another agent: the first may have applied
// it. A read, and a lease renewal, are: they are idempotent.
func TestAWriteCutMidRequestIsNotSentToAnotherAgent(t *testing.T) {
	prefix := fmt.Sprintf("roam-test/agents-%d", prefixes.Add(1))
	s, err := consulstore.New(consulstore.Config{Addresses: []string{hangUp(t), server.Addr}, Prefix: prefix})
	require.NoError(t, err)
	direct := storeAt(t, server.Addr, prefix)
	ctx := context.Background()
	key := location.Key(location.KindActor, "cut")
	_, err = s.CompareAndSet(ctx, key, 0, record(1, 5))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	_, err = direct.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound, "the write went to the second agent as well")

	// A read moves on to the agent that answers, and later calls start there.
	_, err = s.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound)
	_, err = s.CompareAndSet(ctx, key, 0, record(1, 5))
	require.NoError(t, err)

	// A renewal through an agent that hangs up is made through the next.
	s2, err := consulstore.New(consulstore.Config{Addresses: []string{hangUp(t), server.Addr}, Prefix: prefix})
	require.NoError(t, err)
	n := &location.NodeDescriptor{Mesh: "m", NodeRid: "renew", NodeGeneration: 1, EntrySpotId: "roam-entry-renew"}
	lease, err := direct.ClaimNode(ctx, n, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, s2.RenewLease(ctx, lease.ID))
}

// With the addresses of three Consul servers, the store outlives the one
// it was using: after that agent is killed, reads, CAS (with the lease
// check) and lease renewals go through another server, and the lease
// created through the dead agent lives on, also once the cluster has
// marked that agent's node failed — its session has no health checks, so
// it is the cluster's, not the agent's.
func TestTheStoreOutlivesItsConsulAgent(t *testing.T) {
	servers := consultest.Cluster(t, 3)
	// The store uses a follower first, so that killing it needs no
	// election.
	var first *consultest.Server
	deadline := time.Now().Add(testwait.Patience(t))
	for first == nil {
		for _, sv := range servers {
			if !sv.IsLeader() && anyLeads(servers) {
				first = sv
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "the cluster elected no leader")
		if first == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	addrs := []string{first.Addr}
	var others []*consultest.Server
	for _, sv := range servers {
		if sv != first {
			addrs = append(addrs, sv.Addr)
			others = append(others, sv)
		}
	}
	s, err := consulstore.New(consulstore.Config{Addresses: addrs, Prefix: "roam-test/outlive"})
	require.NoError(t, err)
	ctx := context.Background()
	node := &location.NodeDescriptor{Mesh: "m", NodeRid: "outlive", NodeGeneration: 1, EntrySpotId: "roam-entry-outlive"}
	lease, err := s.ClaimNode(ctx, node, 10*time.Second)
	require.NoError(t, err)
	key := location.Key(location.KindActor, "outlive")
	leased := location.CheckLeaseOp(location.NodeKeyOf(node), lease.ID)
	vs, err := s.Apply(ctx, []location.Op{location.CreateOp(key, record(1, 0)), leased})
	require.NoError(t, err)
	v := vs[0]

	first.Stop() // the agent every call so far went to
	require.NoError(t, s.RenewLease(ctx, lease.ID))
	got, err := s.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, v, got.Version)
	vs, err = s.Apply(ctx, []location.Op{location.UpdateOp(key, v, record(2, 0)), leased})
	require.NoError(t, err, "a CAS checked by the lease created through the dead agent")
	v = vs[0]

	// Once gossip has marked the dead agent's node failed, its session
	// still stands.
	// Serf marks a stopped agent failed after its probes and suspicion
	// time out (seconds in a 3-node cluster; many more on a busy machine
	// under the race detector): its own bound, not what the leader
	// election left of the first.
	// The lease is renewed meanwhile, as its node does: that can take
	// longer than its TTL (make test once failed here on a busy machine
	// with the session expired, not invalidated).
	renewed := time.Now()
	testwait.Within(t, 3*time.Minute, func() bool {
		if time.Since(renewed) > 2*time.Second {
			if err := s.RenewLease(ctx, lease.ID); err == nil {
				renewed = time.Now()
			}
		}
		return nodeFailed(others[0].Addr, first.Node)
	}, "the cluster marking "+first.Node+" failed")
	require.NoError(t, s.RenewLease(ctx, lease.ID))
	alive, err := s.LeaseAlive(ctx, lease.ID)
	require.NoError(t, err)
	require.True(t, alive)
	_, err = s.Apply(ctx, []location.Op{location.UpdateOp(key, v, record(3, 0)), leased})
	require.NoError(t, err)
	nodes, err := s.ListNodes(ctx, "m")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
}

func anyLeads(servers []*consultest.Server) bool {
	for _, s := range servers {
		if s.IsLeader() {
			return true
		}
	}
	return false
}

// nodeFailed reports whether the agent at addr sees node's serfHealth
// check critical.
func nodeFailed(addr, node string) bool {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + addr + "/v1/health/node/" + node)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var checks []struct{ CheckID, Status string }
	if json.NewDecoder(resp.Body).Decode(&checks) != nil {
		return false
	}
	for _, c := range checks {
		if c.CheckID == "serfHealth" {
			return c.Status == "critical"
		}
	}
	return false
}

// cutOff is a TCP relay to the real agent that can be cut off the way a
// host behind a network partition is: new connections refused, open ones
// kept but silent (no answer, no reset).
type cutOff struct {
	l   net.Listener
	cut chan struct{}
}

func relay(t *testing.T) *cutOff {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &cutOff{l: l, cut: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", server.Addr)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						return
					}
					select {
					case <-c.cut:
						continue // swallowed: the far side never hears it
					default:
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return c
}

func (c *cutOff) partition() {
	close(c.cut)
	c.l.Close()
}

// After a call through an agent that no longer answers (its host cut off:
// the kept connections lead nowhere, new ones are refused), the store
// drops its kept connections to that agent: the next write dials, is
// refused, so provably never sent, and goes to the next agent. Kept
// connections alone would send it into the silence too (Indeterminate).
func TestAPartitionedAgentsKeptConnectionsAreDropped(t *testing.T) {
	prefix := fmt.Sprintf("roam-test/agents-%d", prefixes.Add(1))
	r := relay(t)
	s, err := consulstore.New(consulstore.Config{Addresses: []string{r.l.Addr().String(), server.Addr}, Prefix: prefix})
	require.NoError(t, err)
	ctx := context.Background()
	// Several kept connections: watches, each its own request, ended by
	// their keys' changes.
	keys := make([]location.AuthorityKey, 4)
	versions := make([]location.StoreVersion, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = location.Key(location.KindActor, fmt.Sprintf("kept-%d", i))
		versions[i], err = s.CompareAndSet(ctx, keys[i], 0, record(1, 0))
		require.NoError(t, err)
	}
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Watch(ctx, keys[i], versions[i])
			assert.NoError(t, err)
		}()
	}
	for i := range keys {
		_, err = s.CompareAndSet(ctx, keys[i], versions[i], record(2, 0))
		require.NoError(t, err)
	}
	wg.Wait()

	r.partition()
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = s.CompareAndSet(short, location.Key(location.KindActor, "into-the-silence"), 0, record(1, 0))
	require.ErrorIs(t, err, location.ErrIndeterminate, "sent on a kept connection: no answer")

	key := location.Key(location.KindActor, "after-the-cut")
	bounded, cancel2 := context.WithTimeout(ctx, testwait.Patience(t))
	defer cancel2()
	_, err = s.CompareAndSet(bounded, key, 0, record(1, 0))
	require.NoError(t, err, "the next write dials, is refused, and goes to the next agent")
	direct := storeAt(t, server.Addr, prefix)
	_, err = direct.Read(ctx, key)
	require.NoError(t, err)
}
