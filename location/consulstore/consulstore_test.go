package consulstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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
func BenchmarkApply2(b *testing.B)          { storetest.BenchmarkApply2(b, newStore(b)) }
func BenchmarkReadCASParallel(b *testing.B) { storetest.BenchmarkReadCASParallel(b, newStore(b)) }
