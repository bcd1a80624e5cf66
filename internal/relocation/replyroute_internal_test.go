package relocation

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A reply route is chosen by whoever sends the request: requestOf, the
// host's deadline check and a move's freeze and thaw take any route
// without failing. A request whose route names its operation and deadline
// keeps both through Message Follow (which adds its own headers) and a
// freeze.
// Reference: docs/PROTOCOL.md §4.3, §5.5, §5.14.
func TestHostileReplyRoutesAndFollowedRequests(t *testing.T) {
	ids := []string{
		replyRoutePrefix + strconv.FormatInt(math.MaxInt64, 10) + ".op",
		replyRoutePrefix + strconv.FormatInt(math.MinInt64, 10) + ".op",
		replyRoutePrefix + "+5.op",
		replyRoutePrefix + "-0.op",
		replyRoutePrefix + "99999999999999999999999.op",
		replyRoutePrefix + "1.." + strings.Repeat("x", 300),
		replyRoutePrefix + "1.\u00e9\u0000",
		replyRoutePrefix + "." + "op",
	}
	for _, id := range ids {
		sender := actor.NewPID("10.0.0.1:1", id)
		op, ms, ok := requestOf(nil, sender)
		if ok {
			_ = time.Now().After(time.UnixMilli(ms).Add(deadlineGrace)) // receive's check
		}
		rec, err := toRecord(&actor.MessageEnvelope{Message: wrapperspb.String("x"), Sender: sender})
		require.NoError(t, err, id)
		if ok && ms > 0 {
			require.Equal(t, op, rec.OperationID)
		}
		back, err := fromRecord(rec)
		require.NoError(t, err, id)
		env := back.(*actor.MessageEnvelope)
		op2, ms2, ok2 := requestOf(env.Header, env.Sender)
		if ok && ms > 0 {
			require.True(t, ok2, id)
			require.Equal(t, op, op2, id)
			require.Equal(t, ms, ms2, id)
		}
	}

	// A followed request by Spot ID: hop and generation headers, no
	// operation or deadline header.
	route := actor.NewPID("10.0.0.1:1", ReplyRouteID("abc-1", time.UnixMilli(1_700_000_000_000)))
	followed, _ := withFollowHeaders(&actor.MessageEnvelope{Message: wrapperspb.String("x"), Sender: route}, 7)
	op, ms, ok := requestOf(followed.Header, followed.Sender)
	require.True(t, ok)
	require.Equal(t, "abc-1", op)
	require.EqualValues(t, 1_700_000_000_000, ms)
	rec, err := toRecord(followed)
	require.NoError(t, err)
	require.Equal(t, "abc-1", rec.OperationID)
	require.EqualValues(t, 1_700_000_000_000, rec.DeadlineUnixMillis)
}
