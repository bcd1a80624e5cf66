package failure_test

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// A grain request is answered with a grain error response of the code's
// class, which is the error itself and reads back with its refinement;
// any other request with a DeliveryFailed.
func TestAnswers(t *testing.T) {
	grain := &pcluster.GrainRequest{MethodIndex: 1}
	for _, request := range []any{grain, &actor.MessageEnvelope{Message: grain}, &messages.Envelope{MessageType: failure.GrainRequestType}} {
		require.True(t, failure.IsGrainRequest(request))
		a, ok := failure.Answer(request, roamerr.CodeCapacityExceeded, "Cart/a", "too large").(*pcluster.GrainErrorResponse)
		require.True(t, ok)
		roamerrtest.AssertOneClass(t, a, roamerr.ErrCapacityExceeded)
		require.Equal(t, "too large", a.GetMessage())
		require.Equal(t, "Cart/a", a.GetMetadata()[failure.MetaTarget])
		err := failure.Error(a)
		roamerrtest.AssertOneClass(t, err, roamerr.ErrCapacityExceeded)
		require.Contains(t, err.Error(), "Cart/a: too large")
	}

	ending := failure.Answer(grain, roamerr.CodeOwnerEnding, "Cart/a", "gone")
	roamerrtest.AssertOneClass(t, ending.(error), roamerr.ErrUnavailable)
	require.False(t, errors.Is(ending.(error), roamerr.ErrOwnerEnding), "a response has one Reason")
	roamerrtest.AssertOneClass(t, failure.Error(ending), roamerr.ErrOwnerEnding)

	for _, request := range []any{wrapperspb.String("x"), &actor.MessageEnvelope{Message: wrapperspb.String("x")}, nil, &messages.Envelope{MessageType: "x"}} {
		require.False(t, failure.IsGrainRequest(request))
		a, ok := failure.Answer(request, roamerr.CodeStale, "s", "moved").(*messages.DeliveryFailed)
		require.True(t, ok)
		roamerrtest.AssertOneClass(t, failure.Error(a), roamerr.ErrStale)
	}
}

// An application's own replies, its grain error responses among them,
// are no failure of roam's.
func TestApplicationRepliesAreNotFailures(t *testing.T) {
	for _, reply := range []any{wrapperspb.String("x"), pcluster.NewGrainErrorResponse(pcluster.ErrorReason_NOT_FOUND, "no such cart"),
		(*pcluster.GrainErrorResponse)(nil), nil} {
		require.NoError(t, failure.Error(reply))
	}
	// A class's Reason without roam's metadata (cluster.FromError of an
	// error of that class in a grain's method) still reads as the class.
	own := pcluster.FromError(roamerr.Wrap(roamerr.ErrConflict, "mine", errors.New("x")))
	roamerrtest.AssertOneClass(t, failure.Error(own), roamerr.ErrConflict)
}

func TestSize(t *testing.T) {
	m := wrapperspb.String("hello")
	require.Equal(t, 7, failure.Size(m))
	require.Equal(t, 7, failure.Size(&actor.MessageEnvelope{Message: m}))
	require.Equal(t, 0, failure.Size(struct{}{}))
}
