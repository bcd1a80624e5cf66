package relocation_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/roamerr"
)

// sized answers an Int64Value n with n bytes, and counts the requests
// it ran.
type sized struct{ ran *int }

func (s *sized) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *wrapperspb.Int64Value:
		c.Respond(wrapperspb.Bytes(make([]byte, m.GetValue())))
	case *wrapperspb.BytesValue:
		*s.ran++
		c.Respond(wrapperspb.Int64(int64(len(m.GetValue()))))
	}
}

// On the object's own node, as across nodes, a request by PID over the
// size limit is answered CapacityExceeded and not run, and a reply over
// it is not sent: its caller is answered CapacityExceeded, and it is
// counted. Before, both went through on the same node.
func TestSizeLimitsHoldOnTheObjectsNode(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	ran := 0
	kind := relocation.Kind{StableType: "sized", Producer: func() actor.Actor { return &sized{ran: &ran} }, Policy: relocation.RecreateOnRelocation()}
	n := startNodeConfig(t, newStore(t), relocation.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}, kind)
	pid, err := n.driver.Spawn(context.Background(), "sized", "sized-1")
	require.NoError(t, err)
	root := n.node.System().Root

	reply, err := root.RequestFuture(pid, wrapperspb.Bytes(make([]byte, meshnode.MaxMessageBytes+1)), testwait.Patience(t)).Result()
	require.NoError(t, err)
	roamerrtest.AssertOneClass(t, relocation.DeliveryError(reply), roamerr.ErrCapacityExceeded)
	reply, err = root.RequestFuture(pid, wrapperspb.Int64(meshnode.MaxMessageBytes+1), testwait.Patience(t)).Result()
	require.NoError(t, err)
	roamerrtest.AssertOneClass(t, relocation.DeliveryError(reply), roamerr.ErrCapacityExceeded)
	// Under the limit both go through, and the refused request never ran.
	reply, err = root.RequestFuture(pid, wrapperspb.Bytes(make([]byte, 10)), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 10, reply.(*wrapperspb.Int64Value).GetValue())
	reply, err = root.RequestFuture(pid, wrapperspb.Int64(10), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.Len(t, reply.(*wrapperspb.BytesValue).GetValue(), 10)
	require.Equal(t, 1, ran)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var counted int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "roam.relocation.replies_too_large" {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					counted += p.Value
				}
			}
		}
	}
	require.EqualValues(t, 1, counted)
}
