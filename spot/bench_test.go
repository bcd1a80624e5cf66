package spot_test

import (
	"fmt"
	"testing"
	"time"

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

// BenchmarkRequest compares a request by Spot ID (cached route) with a
// plain Proto.Actor RequestFuture to the same incarnation's PID, in the
// same run: roam's direct-call overhead is the ratio.
func BenchmarkRequest(b *testing.B) {
	for _, s := range stores {
		b.Run(s.name, func(b *testing.B) {
			_, caller := benchWorld(b, s.new(b))
			if _, err := caller.Spots().Request("bench-cart", wrapperspb.String("warm")).InstanceSpot("cart").Do(ctx); err != nil {
				b.Fatal(err)
			}
			pid, err := caller.Resolve(ctx, extension.InstanceSpotRef("bench-cart"))
			if err != nil {
				b.Fatal(err)
			}
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
