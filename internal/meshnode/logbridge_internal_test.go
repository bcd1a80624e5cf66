package meshnode

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Proto.Actor's errors reach roam's log with their text, not as {}.
func TestProtoActorErrorsAreLoggedWithTheirText(t *testing.T) {
	var buf bytes.Buffer
	h := &zerologHandler{log: zerolog.New(&buf), min: slog.LevelInfo}
	r := slog.NewRecord(time.Now(), slog.LevelError, "EndpointWriter lost connection", 0)
	r.AddAttrs(slog.Any("error", errors.New("connection reset by peer")), slog.Int("n", 3))
	require.NoError(t, h.Handle(context.Background(), r))
	require.Contains(t, buf.String(), `"error":"connection reset by peer"`)
	require.Contains(t, buf.String(), `"n":3`)
	require.NotContains(t, buf.String(), `{}`)
}
