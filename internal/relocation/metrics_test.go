package relocation_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// Every finished move is counted by outcome with its pause and payload
// size; object IDs never become metric attributes.
// Reference: docs/PROTOCOL.md §5.1 (an Event per move that logs and metrics
// use).
func TestMovesAreMeasured(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store := newStore(t)
	a := startNodeWith(t, store, counterKind)
	b := startNodeConfig(t, store, relocation.Config{MeterProvider: provider}, counterKind)
	ctx := context.Background()
	_, err := a.driver.Spawn(ctx, "counter", "measured-id")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "measured-id"), b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	found := map[string]bool{}
	for i := 0; i < 100 && len(found) < 3; i++ { // the target records right after its commit
		require.NoError(t, reader.Collect(ctx, &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				found[m.Name] = true
				if m.Name == "roam.relocation.moves" {
					sum := m.Data.(metricdata.Sum[int64])
					require.Len(t, sum.DataPoints, 1)
					require.EqualValues(t, 1, sum.DataPoints[0].Value)
					v, ok := sum.DataPoints[0].Attributes.Value("outcome")
					require.True(t, ok)
					require.Equal(t, "committed", v.AsString())
					for _, kv := range sum.DataPoints[0].Attributes.ToSlice() {
						require.NotContains(t, kv.Value.Emit(), "measured-id")
					}
				}
			}
		}
		if len(found) < 3 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	require.True(t, found["roam.relocation.moves"] && found["roam.relocation.pause"] && found["roam.relocation.payload"], "%v", found)
}
