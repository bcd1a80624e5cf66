package relocation

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A queued request's operation identity and deadline are frozen into the
// saved-work record's own fields and come back as the same headers on the
// target; other headers stay metadata.
// Reference: docs/PROTOCOL.md §5.5, §4.3.
func TestSavedWorkFreezesOperationAndDeadline(t *testing.T) {
	env := &actor.MessageEnvelope{Message: wrapperspb.String("x"), Sender: actor.NewPID("127.0.0.1:1", "future$1")}
	env.SetHeader(HeaderOperation, "op-1")
	env.SetHeader(HeaderDeadline, "1700000000123")
	env.SetHeader("app", "v")
	rec, err := toRecord(env)
	require.NoError(t, err)
	require.Equal(t, "op-1", rec.OperationID)
	require.EqualValues(t, 1700000000123, rec.DeadlineUnixMillis)
	require.Len(t, rec.Metadata, 1)
	require.Equal(t, "app", rec.Metadata[0].Key)

	back, err := fromRecord(rec)
	require.NoError(t, err)
	got := back.(*actor.MessageEnvelope)
	require.Equal(t, "op-1", got.GetHeader(HeaderOperation))
	require.Equal(t, strconv.FormatUint(1700000000123, 10), got.GetHeader(HeaderDeadline))
	require.Equal(t, "v", got.GetHeader("app"))
	require.Equal(t, env.Sender.Id, got.Sender.Id)
}

// A request by Spot ID travels without headers: its reply route's ID names
// its operation and deadline, and a move freezes both as it would the
// headers. A route that is not roam's, or a malformed one, names neither.
// Reference: docs/PROTOCOL.md §4.3, §5.5.
func TestAReplyRouteNamesItsRequest(t *testing.T) {
	deadline := time.UnixMilli(1700000000123)
	route := actor.NewPID("127.0.0.1:1", ReplyRouteID("0a1b2c-3d", deadline))
	require.True(t, strings.HasPrefix(route.Id, "future"), "peers take it for a reply address")
	op, ms, ok := requestOf(nil, route)
	require.True(t, ok)
	require.Equal(t, "0a1b2c-3d", op)
	require.Equal(t, deadline.UnixMilli(), ms)

	rec, err := toRecord(&actor.MessageEnvelope{Message: wrapperspb.String("x"), Sender: route})
	require.NoError(t, err)
	require.Equal(t, "0a1b2c-3d", rec.OperationID)
	require.EqualValues(t, deadline.UnixMilli(), rec.DeadlineUnixMillis)
	require.Empty(t, rec.Metadata)
	back, err := fromRecord(rec)
	require.NoError(t, err)
	got := back.(*actor.MessageEnvelope)
	require.Equal(t, route.Id, got.Sender.Id)
	require.Equal(t, strconv.FormatInt(deadline.UnixMilli(), 10), got.GetHeader(HeaderDeadline))

	require.NotEqual(t, route.Id, ReplyRouteID("0a1b2c-3d", deadline), "a route is unguessable even to whoever saw its operation id")
	for _, id := range []string{"future$12", "future$roam-call.", "future$roam-call.x.op", "future$roam-call.123", "future$roam-call.123.", "future$roam-call.123.op", "roam-call.123.op"} {
		_, _, ok := requestOf(nil, actor.NewPID("127.0.0.1:1", id))
		require.False(t, ok, id)
	}
	// A header wins over the route.
	env := &actor.MessageEnvelope{Message: wrapperspb.String("x"), Sender: route}
	env.SetHeader(HeaderDeadline, "42")
	env.SetHeader(HeaderOperation, "op-h")
	op, ms, ok = requestOf(env.Header, env.Sender)
	require.True(t, ok)
	require.Equal(t, "op-h", op)
	require.EqualValues(t, 42, ms)
}
