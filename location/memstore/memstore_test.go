package memstore_test

import (
	"testing"
	"time"

	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/location/storetest"
)

func harness() storetest.Harness {
	return storetest.Harness{
		New: func(t testing.TB) storetest.Instance {
			clock := memstore.NewManualClock()
			return storetest.Instance{Store: memstore.New(memstore.WithClock(clock)), Pass: clock.Advance}
		},
		LeaseTTL: 10 * time.Second,
		Expiry:   0,
	}
}

// TestContract runs the Location Store contract suite on the embedded store.
func TestContract(t *testing.T) { storetest.Run(t, harness()) }

func BenchmarkCAS(b *testing.B)    { storetest.BenchmarkCAS(b, memstore.New()) }
func BenchmarkApply2(b *testing.B) { storetest.BenchmarkApply2(b, memstore.New()) }
