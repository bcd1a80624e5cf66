package relocation

import (
	"strconv"
	"testing"

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
