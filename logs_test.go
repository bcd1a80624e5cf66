package roam_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/location/memstore"
)

// A quiet default: Proto.Actor's own logs go through roam's logger, at
// warn and above, when the application left its actor system's logger at
// Proto.Actor's default; an application's own logger is kept.
func TestProtoActorLogsGoThroughRoamsLogger(t *testing.T) {
	var buf bytes.Buffer
	system := actor.NewActorSystem()
	_, err := roam.New(system, roam.WithStore(memstore.New()), roam.WithLogger(zerolog.New(&buf)))
	require.NoError(t, err)
	system.Logger().Info("proto-actor info line")
	system.Logger().Warn("proto-actor warn line")
	require.NotContains(t, buf.String(), "proto-actor info line", "info is below the default level")
	require.Contains(t, buf.String(), "proto-actor warn line")
	require.Contains(t, buf.String(), `"component":"protoactor"`)

	buf.Reset()
	system = actor.NewActorSystem()
	_, err = roam.New(system, roam.WithStore(memstore.New()), roam.WithLogger(zerolog.New(&buf)), roam.WithProtoActorLogLevel(slog.LevelInfo))
	require.NoError(t, err)
	system.Logger().Info("proto-actor info line")
	require.Contains(t, buf.String(), "proto-actor info line", "WithProtoActorLogLevel lowers it")

	var own bytes.Buffer
	buf.Reset()
	system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(&own, nil))
	}))
	_, err = roam.New(system, roam.WithStore(memstore.New()), roam.WithLogger(zerolog.New(&buf)))
	require.NoError(t, err)
	system.Logger().Warn("the application's own")
	require.True(t, strings.Contains(own.String(), "the application's own"), "an application's logger is kept")
	require.Empty(t, buf.String())
}
