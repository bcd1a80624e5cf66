package consulstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/storetest"
)

// server is one real Consul for the package's tests (docs/PROTOCOL.md §3.6); every
// store gets its own key prefix, so tests share nothing else.
var server *consultest.Server

func TestMain(m *testing.M) {
	consultest.Main(m, func(s *consultest.Server) { server = s })
}

var prefixes atomic.Int64

func newStore(tb testing.TB) *consulstore.Store {
	s, err := consulstore.New(consulstore.Config{
		Address: server.Addr,
		Prefix:  fmt.Sprintf("roam-test/%d", prefixes.Add(1)),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func harness() storetest.Harness {
	return storetest.Harness{
		New: func(t testing.TB) storetest.Instance {
			// Leases run on Consul's own clock: time passes for real.
			return storetest.Instance{Store: newStore(t), Pass: time.Sleep}
		},
		// The test server's session_ttl_min is 1 s; Consul invalidates a
		// session between TTL and 2×TTL after its last renewal.
		LeaseTTL: time.Second,
		Expiry:   2 * time.Second,
	}
}

// TestContract runs the Location Store contract suite on a real Consul.
func TestContract(t *testing.T) { storetest.Run(t, harness()) }

func BenchmarkCAS(b *testing.B)             { storetest.BenchmarkCAS(b, newStore(b)) }
func BenchmarkRead(b *testing.B)            { storetest.BenchmarkRead(b, newStore(b)) }
func BenchmarkApply2(b *testing.B)          { storetest.BenchmarkApply2(b, newStore(b)) }
func BenchmarkReadCASParallel(b *testing.B) { storetest.BenchmarkReadCASParallel(b, newStore(b)) }

func BenchmarkListAll(b *testing.B) {
	for _, n := range []int{5_000, 20_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) { storetest.BenchmarkListAll(b, newStore(b), n) })
	}
}

// A listing's next page continues from the keys its previous page did not
// reach (Consul lists every key of a prefix, with no cursor): a record
// deleted between two pages is not listed, and none is listed twice.
func TestListContinuesFromTheKeysItKept(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	const n = 2100
	id := func(i int) string { return fmt.Sprintf("kept-%05d", i) }
	for i := 0; i < n; i += 64 {
		var ops []location.Op
		for j := i; j < min(i+64, n); j++ {
			ops = append(ops, location.CreateOp(location.Key(location.KindActor, id(j)), &location.Record{ObjectGeneration: 1, StableType: "t"}))
		}
		_, err := s.Apply(ctx, ops)
		require.NoError(t, err)
	}
	first, err := s.List(ctx, location.KindActor, location.PageRequest{Size: 1000})
	require.NoError(t, err)
	require.Len(t, first.Items, 1000)
	// Gone before the next pages read them: the first of page two, one of
	// page three.
	for _, i := range []int{1000, 2050} {
		v, err := s.Read(ctx, location.Key(location.KindActor, id(i)))
		require.NoError(t, err)
		_, err = s.Apply(ctx, []location.Op{location.DeleteOp(v.Key, v.Version)})
		require.NoError(t, err)
	}
	seen := map[string]bool{}
	for _, v := range first.Items {
		seen[v.Key.ID] = true
	}
	for after := first.Next; after != ""; {
		page, err := s.List(ctx, location.KindActor, location.PageRequest{After: after, Size: 1000})
		require.NoError(t, err)
		for _, v := range page.Items {
			require.False(t, seen[v.Key.ID], "%s listed twice", v.Key.ID)
			seen[v.Key.ID] = true
		}
		after = page.Next
	}
	require.Len(t, seen, n-2)
	require.False(t, seen[id(1000)])
	require.False(t, seen[id(2050)])
}

// rawRecord has roam write the record of Instance Spot id under a prefix
// of its own and returns Consul's own client on the same agent with that
// record's pair as Consul holds it: the raw benchmarks' value.
func rawRecord(b *testing.B, id string) (*api.Client, *api.KVPair) {
	prefix := fmt.Sprintf("roam-test/raw-%d", prefixes.Add(1))
	s, err := consulstore.New(consulstore.Config{Address: server.Addr, Prefix: prefix})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.CompareAndSet(context.Background(), location.Key(location.KindInstanceSpot, id), 0, record(1, 0)); err != nil {
		b.Fatal(err)
	}
	client, err := api.NewClient(&api.Config{Address: server.Addr})
	if err != nil {
		b.Fatal(err)
	}
	pairs, _, err := client.KV().List(prefix, nil)
	if err != nil || len(pairs) != 1 {
		b.Fatalf("the record roam wrote: %d pairs, %v", len(pairs), err)
	}
	return client, pairs[0]
}

// BenchmarkRawTxnCAS is BenchmarkCAS's floor: the same check-and-set of
// the same value on the same agent, as one Consul transaction sent with
// Consul's own client, without roam's encoding, batching or checks.
func BenchmarkRawTxnCAS(b *testing.B) {
	client, pair := rawRecord(b, "bench-cas")
	kv := *pair
	b.ReportAllocs()
	b.ResetTimer()
	// After ResetTimer, which drops metrics reported before it.
	b.ReportMetric(float64(len(kv.Value)), "value-bytes")
	for i := 0; i < b.N; i++ {
		ok, resp, _, err := client.Txn().Txn(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: kv.Key, Value: kv.Value, Index: kv.ModifyIndex}}}, nil)
		if err != nil || !ok {
			b.Fatalf("raw CAS: ok %v, %v", ok, err)
		}
		kv.ModifyIndex = resp.Results[0].KV.ModifyIndex
	}
}

// persistConns counts the process's kept HTTP connections (a read loop
// each).
func persistConns() int {
	buf := make([]byte, 1<<22)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "net/http.(*persistConn).readLoop(")
}

// Close lets go of the connections a Store keeps to its agent: a closed
// Store held them, and two goroutines each, until they had been idle for
// 90 s (the benchmark's leak check saw each of its worlds leave them).
func TestCloseLetsGoOfItsConnections(t *testing.T) {
	before := persistConns()
	s := newStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.CompareAndSet(ctx, location.Key(location.KindActor, fmt.Sprintf("close-%d", i)), 0, record(1, 0))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Greater(t, persistConns(), before, "the store kept no connection")
	require.NoError(t, s.Close())
	testwait.For(t, func() bool { return persistConns() <= before }, "the closed store's connections closing")
}

// BenchmarkRawGet is BenchmarkRead's floor: a consistent GET of the same
// key on the same agent with Consul's own client, without roam's
// decoding, batching or checks.
func BenchmarkRawGet(b *testing.B) {
	client, pair := rawRecord(b, "bench-read")
	key := pair.Key
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if kv, _, err := client.KV().Get(key, &api.QueryOptions{RequireConsistent: true}); err != nil || kv == nil {
			b.Fatalf("raw GET: %v, %v", kv, err)
		}
	}
}
