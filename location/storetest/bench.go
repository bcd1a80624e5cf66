package storetest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/roamactors/roam/location"
)

// BenchmarkCAS measures one compare-and-set on one key, the version carried
// from the previous write (no read in the loop).
func BenchmarkCAS(b *testing.B, s location.Store) {
	ctx := context.Background()
	key := location.Key(location.KindInstanceSpot, "bench-cas")
	v, err := s.CompareAndSet(ctx, key, 0, rec("bench", 1))
	if err != nil {
		b.Fatal(err)
	}
	r := rec("bench", 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.ObjectGeneration = uint64(i + 2)
		if v, err = s.CompareAndSet(ctx, key, v, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead measures one read of one key's record, consistent where
// the store tells consistent reads apart (Consul).
func BenchmarkRead(b *testing.B, s location.Store) {
	ctx := context.Background()
	key := location.Key(location.KindInstanceSpot, "bench-read")
	if _, err := s.CompareAndSet(ctx, key, 0, rec("bench", 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Read(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApply2 measures one atomic transaction updating two keys, the
// shape of a SpotWide relocation or an Actor Join commit.
func BenchmarkApply2(b *testing.B, s location.Store) {
	ctx := context.Background()
	k1 := location.Key(location.KindUserSpot, "bench-apply-spot")
	k2 := location.Key(location.KindActor, "bench-apply-actor")
	vs, err := s.Apply(ctx, []location.Op{location.CreateOp(k1, rec("bench", 1)), location.CreateOp(k2, rec("bench", 1))})
	if err != nil {
		b.Fatal(err)
	}
	r1, r2 := rec("bench", 1), rec("bench", 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r1.ObjectGeneration, r2.ObjectGeneration = uint64(i+2), uint64(i+2)
		if vs, err = s.Apply(ctx, []location.Op{location.UpdateOp(k1, vs[0], r1), location.UpdateOp(k2, vs[1], r2)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadCASParallel measures a consistent read then a
// compare-and-set, each goroutine on its own key: the store calls of one
// owner commit, many moves at once (a drain).
func BenchmarkReadCASParallel(b *testing.B, s location.Store) {
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := location.Key(location.KindInstanceSpot, fmt.Sprintf("bench-par-%d", n.Add(1)))
		v, err := s.CompareAndSet(ctx, key, 0, rec("bench", 1))
		if err != nil {
			b.Error(err)
			return
		}
		r := rec("bench", 1)
		for i := 2; pb.Next(); i++ {
			if _, err := s.Read(ctx, key); err != nil {
				b.Error(err)
				return
			}
			r.ObjectGeneration = uint64(i)
			if v, err = s.CompareAndSet(ctx, key, v, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkListAll measures paging through every record of a kind, a
// start-up recovery scan, with n records in the store: the time per
// record should not grow with n.
func BenchmarkListAll(b *testing.B, s location.Store, n int) {
	ctx := context.Background()
	const batch = 64
	for i := 0; i < n; i += batch {
		var ops []location.Op
		for j := i; j < min(i+batch, n); j++ {
			ops = append(ops, location.CreateOp(location.Key(location.KindInstanceSpot, fmt.Sprintf("list-%07d", j)), rec("bench", 1)))
		}
		if _, err := s.Apply(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seen, after := 0, ""
		for {
			page, err := s.List(ctx, location.KindInstanceSpot, location.PageRequest{After: after, Size: location.MaxPageSize})
			if err != nil {
				b.Fatal(err)
			}
			seen += len(page.Items)
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		if seen != n {
			b.Fatalf("listed %d of %d", seen, n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/record")
}
