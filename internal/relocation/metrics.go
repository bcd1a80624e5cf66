package relocation

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/roamerr"
)

// metrics records every finished move on an OpenTelemetry meter provider,
// as Proto.Actor reports its own: a count by outcome, the pause and the
// payload size. Object IDs are never attributes (they are log fields).
type metrics struct {
	moves metric.Int64Counter
	pause metric.Float64Histogram
	bytes metric.Int64Histogram
	// undelivered counts accepted one-way sends that ended without a
	// handler (their object gone), by reason event; each is also logged.
	undelivered metric.Int64Counter
	// refusedN counts control messages refused for their sender, by
	// message (the log lines are rate-limited; the count is not).
	refusedN metric.Int64Counter
	// repliesTooLarge counts replies over the size limit that were
	// answered CapacityExceeded in their place (object.limitReply).
	repliesTooLarge metric.Int64Counter
}

func newMetrics(p metric.MeterProvider) (*metrics, error) {
	if p == nil {
		p = otel.GetMeterProvider() // a no-op until the application sets one
	}
	m := p.Meter("github.com/roamactors/roam/internal/relocation")
	moves, err1 := m.Int64Counter("roam.relocation.moves", metric.WithDescription("finished moves, by outcome, on the target"))
	pause, err2 := m.Float64Histogram("roam.relocation.pause", metric.WithUnit("ms"),
		metric.WithDescription("seal on the source to dispatch open on the target"))
	bytes, err3 := m.Int64Histogram("roam.relocation.payload", metric.WithUnit("By"), metric.WithDescription("relocation-envelope-v1 payload size"))
	undelivered, err4 := m.Int64Counter("roam.relocation.sends_undelivered",
		metric.WithDescription("accepted one-way sends that ended undelivered because their object is gone, by reason"))
	refused, err5 := m.Int64Counter("roam.relocation.control_refused",
		metric.WithDescription("control messages refused because their sender is not entitled to them, by message"))
	tooLarge, err6 := m.Int64Counter("roam.relocation.replies_too_large",
		metric.WithDescription("replies over the size limit, not sent; their callers were answered CapacityExceeded"))
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return nil, errors.Join(roamerr.ErrInvalidOperation, err)
	}
	return &metrics{moves: moves, pause: pause, bytes: bytes, undelivered: undelivered, refusedN: refused, repliesTooLarge: tooLarge}, nil
}

// outcome names an Event's result for the metric attribute.
func outcome(e Event) string {
	switch {
	case e.Err == nil:
		return "committed"
	case errors.Is(e.Err, roamerr.ErrStale):
		return "stale"
	case errors.Is(e.Err, roamerr.ErrDeadlineExceeded):
		return "deadline"
	}
	return "failed"
}

func (m *metrics) record(e Event) {
	ctx := context.Background()
	attrs := metric.WithAttributes(attribute.String("outcome", outcome(e)), attribute.Bool("fallback", e.Fallback))
	m.moves.Add(ctx, 1, attrs)
	if e.Err == nil {
		m.pause.Record(ctx, float64(e.Pause.Microseconds())/1000)
		m.bytes.Record(ctx, int64(e.Bytes))
	}
}

func (m *metrics) sendUndelivered(reason string) { m.sendsUndeliveredN(reason, 1) }

func (m *metrics) replyTooLarge() { m.repliesTooLarge.Add(context.Background(), 1) }

func (m *metrics) refused(message string) {
	m.refusedN.Add(context.Background(), 1, metric.WithAttributes(attribute.String("message", message)))
}

func (m *metrics) sendsUndeliveredN(reason string, n int) {
	m.undelivered.Add(context.Background(), int64(n), metric.WithAttributes(attribute.String("reason", reason)))
}
