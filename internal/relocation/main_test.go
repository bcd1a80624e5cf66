package relocation_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
)

// consul is one real Consul server (built by tools/consul) for the
// package's tests; docs/PROTOCOL.md §3.6 says how the store uses it.
var consul *consultest.Server

func TestMain(m *testing.M) {
	consultest.Main(m, func(s *consultest.Server) { consul = s })
}

var prefixes atomic.Int64

// newConsulStore is a store on the real Consul under a fresh prefix.
func newConsulStore(t testing.TB) location.Store {
	s, err := consulstore.New(consulstore.Config{Address: consul.Addr, Prefix: fmt.Sprintf("roam-relocation-test/%d", prefixes.Add(1))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
