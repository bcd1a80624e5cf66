// Package failure is the answer roam gives a request in place of the
// object it was for (the object is gone, moving, unreachable; the
// request or its reply is over the size limit), and the typed error a
// caller reads back from it.
//
// A grain request (Proto.Actor's cluster.GrainRequest, what generated
// grain clients send) is answered with a *cluster.GrainErrorResponse:
// the generated client returns it as the call's error, and roamerr's
// classes match it with errors.Is (its Reason is the class's). Any other
// request is answered with a *messages.DeliveryFailed, which Spot calls
// and roam.DeliveryError turn into the typed error: a generated client
// would return "unknown response type" for it, and a plain actor's
// caller keeps the answer it knows.
package failure

import (
	"errors"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The metadata keys of a grain error response roam answers: the wire
// code (with a refinement of Unavailable, the refinement's) and the ID of
// the object the request was for.
const (
	MetaCode   = "roam-code"
	MetaTarget = "roam-target"
)

// GrainRequestType is the protobuf name of cluster.GrainRequest, as a
// frame or a wire envelope names it.
const GrainRequestType = "cluster.GrainRequest"

// IsGrainRequest reports whether msg (or the message of an envelope,
// Proto.Actor's or roam's wire form) is a grain request.
func IsGrainRequest(msg any) bool {
	switch m := msg.(type) {
	case *pcluster.GrainRequest:
		return true
	case *actor.MessageEnvelope:
		return IsGrainRequest(m.Message)
	case *messages.Envelope:
		return m.GetMessageType() == GrainRequestType
	}
	return false
}

// Answer is the answer to request when roam could not deliver it, or
// refused it, with the wire code code; target is the ID of the object it
// was for.
func Answer(request any, code, target, detail string) proto.Message {
	if IsGrainRequest(request) {
		return GrainAnswer(code, target, detail)
	}
	return &messages.DeliveryFailed{Code: code, Detail: detail, TargetId: target}
}

// GrainAnswer is Answer for a grain request.
func GrainAnswer(code, target, detail string) *pcluster.GrainErrorResponse {
	var ge *pcluster.GrainErrorResponse
	if !errors.As(roamerr.FromCode(code, detail), &ge) {
		// Cannot happen: every class has a Reason (roamerr).
		ge = pcluster.NewGrainErrorResponse(pcluster.ErrorReason_UNAVAILABLE, "")
	}
	ge.Message = detail
	ge.Metadata = map[string]string{MetaCode: code, MetaTarget: target}
	return ge
}

// Error is the typed error a reply stands for when roam answered the
// request (a *messages.DeliveryFailed, or a *cluster.GrainErrorResponse
// with a class's Reason), with its refinement; nil for any other reply,
// an application's own grain error response among them.
func Error(reply any) error {
	switch r := reply.(type) {
	case *messages.DeliveryFailed:
		return roamerr.FromCode(r.GetCode(), r.GetTargetId()+": "+r.GetDetail())
	case *pcluster.GrainErrorResponse:
		if r == nil {
			return nil
		}
		class := roamerr.Class(r)
		if class == nil {
			return nil
		}
		code := r.GetMetadata()[MetaCode]
		if code == "" || roamerr.Class(roamerr.FromCode(code, "")) != class {
			code = roamerr.Code(class) // its metadata is not roam's
		}
		detail := r.GetMessage()
		if target := r.GetMetadata()[MetaTarget]; target != "" {
			detail = target + ": " + detail
		}
		return roamerr.FromCode(code, detail)
	}
	return nil
}

// Size is the encoded size of msg, the message of a Proto.Actor envelope
// if it is one; 0 for what is not a protobuf message (it cannot cross
// nodes at all, whatever its size).
func Size(msg any) int {
	if env, ok := msg.(*actor.MessageEnvelope); ok {
		msg = env.Message
	}
	if pm, ok := msg.(proto.Message); ok {
		return proto.Size(pm)
	}
	return 0
}
