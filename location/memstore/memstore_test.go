package memstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/roamactors/roam/location"
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
func BenchmarkRead(b *testing.B)   { storetest.BenchmarkRead(b, memstore.New()) }
func BenchmarkApply2(b *testing.B) { storetest.BenchmarkApply2(b, memstore.New()) }

func BenchmarkListAll(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) { storetest.BenchmarkListAll(b, memstore.New(), n) })
	}
}

// A memstore is immediate; a wrapper that embeds one is not (its own
// methods may wait).
func TestImmediateOnlyItself(t *testing.T) {
	s := memstore.New()
	if !location.IsImmediate(s) {
		t.Fatal("a memstore is not immediate")
	}
	type wrapper struct{ *memstore.Store }
	if location.IsImmediate(wrapper{s}) {
		t.Fatal("a wrapper of a memstore is immediate")
	}
}
