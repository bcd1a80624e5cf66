package spot_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/location/memstore"
)

// Calls are counted by route and outcome, activations and creates by
// outcome, with the activation time; Spot IDs are never attributes.
// Reference: docs/PROTOCOL.md §7.4 (Spot IDs are never metric attributes).
func TestSpotOperationsAreMeasured(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	w := newWorld(t, memstore.New())
	a := w.start(func(c *extension.Config) { c.Spot.MeterProvider = provider })
	_, err := request(t, a, "metered-id", "1", "cart")
	require.NoError(t, err)
	_, err = request(t, a, "metered-id", "2") // resolved from the store, then cached
	require.NoError(t, err)
	_, err = request(t, a, "metered-id", "3")
	require.NoError(t, err)
	_, err = a.Spots().GetOrCreate("metered-room", "room").Do(ctx)
	require.NoError(t, err)

	points := map[string]int64{}
	found := map[string]bool{}
	// The target records an activation right after it opened the Spot,
	// which may be after the caller has its reply.
	eventually(t, "the activation is recorded", func() bool {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		points, found = collect(t, rm)
		return found["roam.spot.activation"]
	})
	require.EqualValues(t, 1, points["roam.spot.calls instance_intent=true outcome=ok route=store"], "%v", points)
	require.EqualValues(t, 1, points["roam.spot.calls instance_intent=false outcome=ok route=store"], "%v", points)
	require.EqualValues(t, 1, points["roam.spot.calls instance_intent=false outcome=ok route=cache"], "%v", points)
	require.EqualValues(t, 1, points["roam.spot.operations operation=activate outcome=ok"], "%v", points)
	require.EqualValues(t, 1, points["roam.spot.operations operation=create outcome=created"], "%v", points)
}

// collect flattens counters to "name attr=value …" → sum and lists every
// metric name seen, checking no attribute carries a Spot ID.
func collect(t *testing.T, rm metricdata.ResourceMetrics) (map[string]int64, map[string]bool) {
	points := map[string]int64{}
	found := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			found[m.Name] = true
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				key := m.Name
				for _, kv := range dp.Attributes.ToSlice() {
					require.NotContains(t, kv.Value.Emit(), "metered")
					key += " " + string(kv.Key) + "=" + kv.Value.Emit()
				}
				points[key] += dp.Value
			}
		}
	}
	return points, found
}
