package spot

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/roamerr"
)

// metrics counts Spot operations on an OpenTelemetry meter provider:
// calls by how their route was resolved and how they ended, creates by
// terminal state, activations and closes by outcome, and how long an
// activation took on its target. Spot IDs are never attributes
// (docs/PROTOCOL.md §7.4); they are log fields.
type metrics struct {
	calls      metric.Int64Counter
	operations metric.Int64Counter
	activation metric.Float64Histogram
	// callSets holds each callKey's attribute option, built once: a call
	// by Spot ID would otherwise build and sort an attribute set every
	// time (the keys are few: routes × intent × roamerr classes).
	callSets sync.Map // callKey → []metric.AddOption
	// forOperator is how many objects of ended owners wait for an
	// operator, as the last recovery pass counted (a gauge).
	forOperator atomic.Int64
}

type callKey struct {
	route    string
	instance bool
	outcome  string
}

func newMetrics(p metric.MeterProvider) (*metrics, error) {
	if p == nil {
		p = otel.GetMeterProvider() // a no-op until the application sets one
	}
	m := p.Meter("github.com/roamactors/roam/internal/spot")
	calls, err1 := m.Int64Counter("roam.spot.calls", metric.WithDescription("direct calls by Spot ID, by route (cache, store) and outcome"))
	ops, err2 := m.Int64Counter("roam.spot.operations", metric.WithDescription("creates, cold activations and closes, by operation and outcome"))
	act, err3 := m.Float64Histogram("roam.spot.activation", metric.WithUnit("ms"),
		metric.WithDescription("activation envelope received to the Spot serving, on the target"))
	out := &metrics{calls: calls, operations: ops, activation: act}
	_, err4 := m.Int64ObservableGauge("roam.recovery.waiting_for_operator",
		metric.WithDescription("objects of ended owners that wait for an operator's ReleaseEnded, as this node's last recovery pass counted them"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(out.forOperator.Load())
			return nil
		}))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, errors.Join(roamerr.ErrInvalidOperation, err)
	}
	return out, nil
}

// outcomeOf names an error's class for a metric attribute.
func outcomeOf(err error) string {
	if err == nil {
		return "ok"
	}
	return roamerr.Code(err)
}

func (m *metrics) call(route string, instance bool, err error) {
	k := callKey{route, instance, outcomeOf(err)}
	opts, ok := m.callSets.Load(k)
	if !ok {
		opts, _ = m.callSets.LoadOrStore(k, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("route", route),
			attribute.Bool("instance_intent", instance), attribute.String("outcome", k.outcome)))})
	}
	m.calls.Add(context.Background(), 1, opts.([]metric.AddOption)...) // the slice kept: no allocation per call
}

func (m *metrics) operation(op, outcome string) {
	m.operations.Add(context.Background(), 1, metric.WithAttributes(attribute.String("operation", op), attribute.String("outcome", outcome)))
}

// activated records an activation that took took.
func (m *metrics) activated(took time.Duration) {
	m.activation.Record(context.Background(), float64(took.Microseconds())/1000)
}
