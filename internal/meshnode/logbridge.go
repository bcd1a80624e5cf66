package meshnode

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// zerologHandler sends Proto.Actor's slog records to roam's zerolog logger,
// so one configured output carries both.
type zerologHandler struct {
	log   zerolog.Logger
	min   slog.Level
	attrs []slog.Attr
	group string
}

func (h *zerologHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }

func (h *zerologHandler) Handle(_ context.Context, r slog.Record) error {
	ev := h.log.WithLevel(zerologLevel(r.Level))
	if ev == nil {
		return nil
	}
	ev = ev.Str("component", "protoactor")
	add := func(a slog.Attr) bool {
		key := a.Key
		if h.group != "" {
			key = h.group + "." + key
		}
		switch v := a.Value.Resolve().Any().(type) {
		case error:
			// An error's fields are mostly unexported: as an interface it
			// would be written as {}. Its text is what a reader needs.
			ev = ev.Str(key, v.Error())
		case fmt.Stringer:
			ev = ev.Str(key, v.String())
		default:
			ev = ev.Interface(key, v)
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	ev.Msg(r.Message)
	return nil
}

func (h *zerologHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	return &c
}

func (h *zerologHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}

func zerologLevel(l slog.Level) zerolog.Level {
	switch {
	case l >= slog.LevelError:
		return zerolog.ErrorLevel
	case l >= slog.LevelWarn:
		return zerolog.WarnLevel
	case l >= slog.LevelInfo:
		return zerolog.InfoLevel
	}
	return zerolog.DebugLevel
}

// ProtoActorLogger is a Proto.Actor logger that writes through l the
// records at min and above.
func ProtoActorLogger(l zerolog.Logger, min slog.Level) *slog.Logger {
	return slog.New(&zerologHandler{log: l, min: min})
}

// HasDefaultLogger reports whether system logs through Proto.Actor's
// default logger (coloured text at info level to stderr), which the
// application did not choose.
func HasDefaultLogger(system *actor.ActorSystem) bool {
	return fmt.Sprintf("%T", system.Logger().Handler()) == "*tint.handler"
}
