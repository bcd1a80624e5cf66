package roamerr

import (
	"reflect"
	"strings"
)

// class is the type of the classes and the refinements.
type class struct {
	text string
	code string
}

func (c *class) Error() string { return c.text }

// As presents a class as Proto.Actor's *cluster.GrainErrorResponse, so
// that errors.Is(err, ErrCapacityExceeded) holds for the error a generated
// grain client returns when roam answered the call in its grain's place:
// the client returns the *cluster.GrainErrorResponse it got, whose Is
// asks errors.As of the target and compares the Reason. Each class has a
// Reason of its own, "ROAM_" and its code in capitals (ROAM_NOT_FOUND,
// ROAM_CAPACITY_EXCEEDED, ...), which none of Proto.Actor's reasons
// starts with, so an application's own grain error never matches a
// class. A refinement has no Reason of its own: a grain error response
// has one Reason, and an ending owner is Unavailable as well (its code is
// in the response's metadata, which roam.DeliveryError reads).
//
// The same makes cluster.FromError(err) of an error of a class, in a
// grain's own method, answer that class's Reason with the class's text.
//
// roamerr knows the type by name, not by import: the Location Store's
// packages use roamerr without Proto.Actor.
func (c *class) As(target any) bool {
	if IsRefinement(c) {
		return false
	}
	p := reflect.ValueOf(target)
	if p.Kind() != reflect.Pointer || p.IsNil() {
		return false
	}
	ptr := p.Elem()
	if ptr.Kind() != reflect.Pointer || !ptr.CanSet() {
		return false
	}
	t := ptr.Type().Elem()
	if t.Name() != "GrainErrorResponse" || t.PkgPath() != "github.com/asynkron/protoactor-go/cluster" {
		return false
	}
	v := reflect.New(t)
	reason, message := v.Elem().FieldByName("Reason"), v.Elem().FieldByName("Message")
	if reason.Kind() != reflect.String || message.Kind() != reflect.String {
		return false
	}
	reason.SetString(grainReasonPrefix + strings.ToUpper(c.code))
	message.SetString(c.text)
	ptr.Set(v)
	return true
}

// grainReasonPrefix starts the Reason of every class's grain error
// response.
const grainReasonPrefix = "ROAM_"
