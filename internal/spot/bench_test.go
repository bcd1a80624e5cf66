package spot_test

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/location"
)

// benchWorld is two nodes: the caller hosts no cart, so every cart lives
// on the other node and every call crosses the remote.
func benchWorld(b *testing.B, store location.Store) (*world, *extension.Extension) {
	w := newWorld(b, store)
	caller := w.start(withKinds(w.roomKind()))
	w.start()
	return w, caller
}

// benchCart is a benchWorld with the cart "bench-cart" activated on the
// other node: the caller, and the cart's PID.
func benchCart(b *testing.B, store location.Store) (*extension.Extension, *actor.PID) {
	_, caller := benchWorld(b, store)
	if _, err := caller.Spots().Request("bench-cart", wrapperspb.String("warm")).InstanceSpot("cart").Do(ctx); err != nil {
		b.Fatal(err)
	}
	pid, err := caller.Resolve(ctx, extension.InstanceSpotRef("bench-cart"))
	if err != nil {
		b.Fatal(err)
	}
	return caller, pid
}

// BenchmarkRequest compares a request by Spot ID (cached route) with a
// plain Proto.Actor RequestFuture to the same incarnation's PID, in the
// same run: roam's direct-call overhead is the ratio.
func BenchmarkRequest(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			caller, pid := benchCart(b, s.new(b))
			b.Run("by-spot-id", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if _, err := caller.Spots().Request("bench-cart", wrapperspb.String("x")).Do(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("by-pid-baseline", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if _, err := caller.System().Root.RequestFuture(pid, wrapperspb.String("x"), 5*time.Second).Result(); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkRequestParallel is BenchmarkRequest with 32 callers (16 per
// CPU on two) each calling again as soon as its call returns: the
// throughput of requests by Spot ID against requests by PID.
func BenchmarkRequestParallel(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			caller, pid := benchCart(b, s.new(b))
			parallel := func(b *testing.B, call func() error) {
				b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := call(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.Run("by-spot-id", func(b *testing.B) {
				parallel(b, func() error {
					_, err := caller.Spots().Request("bench-cart", wrapperspb.String("x")).Do(ctx)
					return err
				})
			})
			b.Run("by-pid-baseline", func(b *testing.B) {
				parallel(b, func() error {
					_, err := caller.System().Root.RequestFuture(pid, wrapperspb.String("x"), 5*time.Second).Result()
					return err
				})
			})
		})
	}
}

// BenchmarkColdActivation measures a request with Instance intent to a
// Missing Spot: resolve, activation envelope, recovery root, reservation,
// factory, Ready commit and the first handler's reply.
func BenchmarkColdActivation(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			_, caller := benchWorld(b, s.new(b))
			for i := 0; i < b.N; i++ {
				if _, err := caller.Spots().Request(fmt.Sprintf("cold-%d", i), wrapperspb.String("x")).InstanceSpot("cart").Do(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkColdActivationParallel is BenchmarkColdActivation with 32
// callers (16 per CPU on two), each activating a Spot of its own again as
// soon as its call returns: `make bench` (h)'s activations by 32 callers.
func BenchmarkColdActivationParallel(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			_, caller := benchWorld(b, s.new(b))
			var next atomic.Int64
			b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("cold-%d", next.Add(1))
					if _, err := caller.Spots().Request(id, wrapperspb.String("x")).InstanceSpot("cart").Do(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkRequestInterleaved alternates a request by Spot ID (cached
// route) and a plain Proto.Actor RequestFuture to the same incarnation's
// PID in one loop, so both see the same machine, and reports each one's
// median and their ratio: roam's direct-call overhead.
func BenchmarkRequestInterleaved(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			caller, pid := benchCart(b, s.new(b))
			byID, byPID := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			byIDOnce := func() time.Duration {
				t0 := time.Now()
				if _, err := caller.Spots().Request("bench-cart", wrapperspb.String("x")).Do(ctx); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			byPIDOnce := func() time.Duration {
				t0 := time.Now()
				if _, err := caller.System().Root.RequestFuture(pid, wrapperspb.String("x"), 5*time.Second).Result(); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			for i := 0; i < b.N; i++ {
				// Each goes first every other time: the second of two calls
				// in a row finds the goroutines it needs awake.
				if i%2 == 0 {
					byID = append(byID, byIDOnce())
					byPID = append(byPID, byPIDOnce())
				} else {
					byPID = append(byPID, byPIDOnce())
					byID = append(byID, byIDOnce())
				}
			}
			med := func(d []time.Duration) time.Duration {
				slices.Sort(d)
				return d[len(d)/2]
			}
			id, p := med(byID), med(byPID)
			b.ReportMetric(float64(id.Microseconds()), "µs-by-id-p50")
			b.ReportMetric(float64(p.Microseconds()), "µs-by-pid-p50")
			b.ReportMetric(float64(id)/float64(p), "ratio")
		})
	}
}

// BenchmarkCheckpointedSpot is the throughput of requests to one stateful
// Spot on another node whose kind checkpoints after every message, at most
// every 100 ms, or never, side by side in one run (the ratio to "never" is
// what checkpoints cost a busy object), and how many checkpoints were
// written per request.
func BenchmarkCheckpointedSpot(b *testing.B) {
	policies := []struct {
		name string
		set  func(k *extension.Kind)
	}{
		{"every-message", func(k *extension.Kind) { k.CheckpointEvery = 1 }},
		{"every-100ms", func(k *extension.Kind) { k.CheckpointInterval = 100 * time.Millisecond }},
		{"never", func(k *extension.Kind) { k.NoCheckpoints = true }},
	}
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			w := newWorld(b, s.new(b))
			var kinds []extension.Kind
			for _, p := range policies {
				k := w.cartKind("vault-" + p.name)
				k.ReactivateEmpty = false
				p.set(&k)
				kinds = append(kinds, k)
			}
			caller := w.start(withKinds(w.roomKind()))
			owner := w.start(withKinds(kinds...))
			for _, p := range policies {
				id, typ := "bench-"+p.name, "vault-"+p.name
				if _, err := caller.Spots().Request(id, wrapperspb.String("warm")).InstanceSpot(typ).Do(ctx); err != nil {
					b.Fatal(err)
				}
				b.Run(p.name, func(b *testing.B) {
					_, before := owner.CheckpointStats()
					for i := 0; i < b.N; i++ {
						if _, err := caller.Spots().Request(id, wrapperspb.String("x")).Do(ctx); err != nil {
							b.Fatal(err)
						}
					}
					_, after := owner.CheckpointStats()
					b.ReportMetric(float64(after.Written-before.Written)/float64(b.N), "checkpoints/op")
				})
			}
		})
	}
}
