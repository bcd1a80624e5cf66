package relocation

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/ctxext"

	"github.com/roamactors/roam/roamerr"
)

// host is the actor Proto.Actor runs for every incarnation: it holds the
// application's actor (inner) and hands it each message through the
// incarnation's host context (object.hc), doing roam's part of a turn
// around it (object.receive).
//
// roam used to do that part in a receiver middleware and a sender
// middleware, and the context found its object as a context extension.
// Either one makes Proto.Actor give the context its extras (about 200
// bytes with the extension table) at the first message: a fifth of an idle
// Spot's heap. A host actor needs neither: the application's Props keep
// their own middleware, run before the host, as roam's was innermost.
type host struct {
	o     *object // nil until bound: at spawn (Driver.props' init), or after a restart (restarting)
	inner actor.Actor
}

// restarting holds, from its Restart system message until its new host's
// first message, the object of an incarnation that Proto.Actor restarts:
// the restart makes a new host from the kind's shared Props, which cannot
// name the object. Keyed by the incarnation's PID (the very pointer its
// context keeps as Self).
var restarting sync.Map // *actor.PID → *object

// Restart (the mailbox's restart hook) is told of a restart before
// Proto.Actor makes the new instance, on the incarnation's goroutine.
func (o *object) Restart() {
	if o.pid != nil {
		restarting.Store(o.pid, o)
	}
}

func (h *host) Receive(c actor.Context) {
	o := h.o
	if o == nil {
		v, ok := restarting.LoadAndDelete(c.Self())
		if !ok {
			return // not spawned by Driver.incarnate, which stops it
		}
		o = v.(*object)
		h.o = o
	}
	hd := c.MessageHeader()
	o.hc.Context = c
	if o.first != nil {
		defer o.afterTurn(hd) // also when the handler panics
	}
	o.receive(h, c, hd, c.Message(), c.Sender())
}

// hostContext is the context the application's actor gets: the
// incarnation's, with roam's part of what it sends (the reply size limit,
// the co-location sample) and the object found by Get(hostExtensionID).
// Only the incarnation's goroutine uses it, within a turn.
type hostContext struct {
	actor.Context
	o *object
	// delivered is the message the actor is handed when it is not the
	// context's own: the ClusterInit roam delivers after Started.
	delivered *actor.MessageEnvelope
}

// hostExtensionID names, for Get, the object whose incarnation's context
// is asked (Timers, KeepState, SenderTag find it so; a wrapper of the
// context that passes Get on, such as a grain's GrainContext, finds it
// too).
var hostExtensionID = ctxext.NextContextExtensionID()

func (h *hostContext) Get(id ctxext.ContextExtensionID) ctxext.ContextExtension {
	if id == hostExtensionID {
		return h.o
	}
	return h.Context.Get(id)
}

// ExtensionID makes the object a context extension, what Get returns.
func (o *object) ExtensionID() ctxext.ContextExtensionID { return hostExtensionID }

// Actor is the application's actor, not roam's host.
func (h *hostContext) Actor() actor.Actor { return h.o.inst }

func (h *hostContext) Message() any {
	if h.delivered != nil {
		return h.delivered.Message
	}
	return h.Context.Message()
}

func (h *hostContext) MessageHeader() actor.ReadonlyMessageHeader {
	if h.delivered != nil {
		return actor.UnwrapEnvelopeHeader(h.delivered)
	}
	return h.Context.MessageHeader()
}

func (h *hostContext) Sender() *actor.PID {
	if h.delivered != nil {
		return h.delivered.Sender
	}
	return h.Context.Sender()
}

func (h *hostContext) Send(pid *actor.PID, message any) { h.send(pid, message) }

func (h *hostContext) Request(pid *actor.PID, message any) {
	h.send(pid, &actor.MessageEnvelope{Message: message, Sender: h.Self()})
}

func (h *hostContext) RequestWithCustomSender(pid *actor.PID, message any, sender *actor.PID) {
	h.send(pid, &actor.MessageEnvelope{Message: message, Sender: sender})
}

func (h *hostContext) RequestFuture(pid *actor.PID, message any, timeout time.Duration) *actor.Future {
	f := actor.NewFuture(h.ActorSystem(), timeout)
	h.send(pid, &actor.MessageEnvelope{Message: message, Sender: f.PID()})
	return f
}

func (h *hostContext) Respond(response any) {
	sender := h.Sender()
	if sender == nil {
		h.ActorSystem().DeadLetter.SendUserMessage(nil, response)
		return
	}
	h.send(sender, response)
}

// Forward passes the message on as Proto.Actor does (its sender kept):
// not a reply, and not sampled.
func (h *hostContext) Forward(pid *actor.PID) {
	if h.delivered != nil {
		h.send(pid, h.delivered)
		return
	}
	h.Context.Forward(pid)
}

// send is every send of the application's actor: a reply over the size
// limit is replaced by its failure (limitReply), and one message in
// SampleEvery is stamped with its sender for co-location (sample).
func (h *hostContext) send(pid *actor.PID, message any) {
	o := h.o
	if pid != nil {
		message = o.limitReply(h, pid, message)
		if n := o.d.cfg.SampleEvery; n > 0 {
			message = o.sample(pid, message, n)
		}
	}
	h.Context.Send(pid, message)
}

// producerOf is the Props' producer of the application's actor, which
// the host holds. Proto.Actor keeps it in an unexported field with no
// accessor; roam reads it once, when a kind is registered. Nil if this
// Proto.Actor version has no such field (RegisterKind then refuses the
// kind; a test pins it for the version roam is built with).
func producerOf(p *actor.Props) actor.ProducerWithActorSystem {
	f := reflect.ValueOf(p).Elem().FieldByName("producer")
	if !f.IsValid() || f.Type() != reflect.TypeFor[actor.ProducerWithActorSystem]() {
		return nil
	}
	return *(*actor.ProducerWithActorSystem)(unsafe.Pointer(f.UnsafeAddr()))
}

// namesDispatcher reports whether the Props name a dispatcher of their
// own (actor.WithDispatcher), which Proto.Actor keeps in an unexported
// field; true when this Proto.Actor version has no such field, so that
// the Props keep whatever they mean.
func namesDispatcher(p *actor.Props) bool {
	f := reflect.ValueOf(p).Elem().FieldByName("dispatcher")
	if !f.IsValid() || f.Kind() != reflect.Interface {
		return true
	}
	return !f.IsNil()
}

// hostProducer makes a host around an instance of the Props' actor.
func (d *Driver) hostProducer(props *actor.Props) (actor.Producer, error) {
	inner := producerOf(props)
	if inner == nil {
		return nil, fmt.Errorf("%w: this Proto.Actor version's Props do not let roam make the application's actor", roamerr.ErrNotConfigured)
	}
	return func() actor.Actor { return &host{inner: inner(d.sys)} }, nil
}

// isFuture reports whether pid is a reply address: a future's or a
// Spot call's reply route (ReplyRouteID).
func isFuture(pid *actor.PID) bool { return strings.HasPrefix(pid.Id, "future") }
