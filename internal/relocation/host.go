package relocation

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation/mailbox"
	"github.com/roamactors/roam/internal/relocation/spawn"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// HeaderOperation carries a call's operation identity, so the first message
// of a cold activation is recognised when its handler completes
// (docs/PROTOCOL.md §7.5) and a redelivery of the same operation can be
// told apart.
const HeaderOperation = "roam-operation"

// HeaderDeadline is a request's absolute deadline in Unix milliseconds. A
// request dispatched after it (plus deadlineGrace for clock skew between
// nodes) is answered DeadlineExceeded and not run: its caller has given up
// (PROTOCOL.md §4.2, §4.3).
const HeaderDeadline = "roam-deadline"

// HeaderDispatchNotice marks a one-way send that travels as a cold
// activation's first message (SpotActivation): it names a future of the
// sending call. The incarnation sends a RouteBarrier there when it
// dispatches the message, just before the handler runs, and roam's
// answer to a failure of that first message goes there too (ReplyRoute).
// The caller's Send returns on it, so its next call to the Spot — straight
// to the now Ready incarnation, say — cannot overtake the first
// (PROTOCOL.md §7.5: no later message overtakes the first).
const HeaderDispatchNotice = "roam-dispatch-notice"

// DispatchNotice is the HeaderDispatchNotice value naming pid.
func DispatchNotice(pid *actor.PID) string { return pid.Address + "\n" + pid.Id }

// noticePID parses a HeaderDispatchNotice value; nil if malformed.
func noticePID(v string) *actor.PID {
	addr, id, ok := strings.Cut(v, "\n")
	if !ok || addr == "" || id == "" {
		return nil
	}
	return actor.NewPID(addr, id)
}

// ReplyRoute is where roam answers a failure of a SpotActivation's first
// message: its sender (a request), else the send's dispatch notice; nil
// for a send without one.
func ReplyRoute(first *messages.Envelope) *actor.PID {
	if s := first.GetSender(); s != nil {
		return actor.NewPID(s.GetAddress(), s.GetId())
	}
	return noticePID(first.GetHeaders()[HeaderDispatchNotice])
}

// replyRoutePrefix starts the ID of a Spot request's reply route, which
// names the request's deadline and operation id after 128 random bits:
// "future$roam-call.<deadline, Unix ms>.<token>.<operation id>". The token
// makes the route unguessable: operation ids are a per-process prefix and
// a counter, so whoever saw one could name the next call's reply route
// and answer it first (docs/SECURITY.md). A request by Spot
// ID then travels without headers: Proto.Actor sends a header map with its
// message and builds one on receipt, which made a call by Spot ID about 10
// µs slower than the same call by PID on a 2-core machine (PROTOCOL.md
// §4.3). It starts with "future", as every reply address does.
const replyRoutePrefix = "future$roam-call."

// ReplyRouteID is the reply route ID of a request with this operation id
// and deadline.
func ReplyRouteID(operation string, deadline time.Time) string {
	// One allocation: a reply route is made for every request by Spot ID.
	var buf [len(replyRoutePrefix) + 20 + 1 + 32 + 1]byte
	b := append(buf[:0], replyRoutePrefix...)
	b = strconv.AppendInt(b, deadline.UnixMilli(), 10)
	b = append(b, '.')
	b = ask.AppendToken(b)
	b = append(b, '.')
	var s strings.Builder
	s.Grow(len(b) + len(operation))
	s.Write(b)
	s.WriteString(operation)
	return s.String()
}

// requestOf is what a request says of its operation id and deadline: its
// headers, else its reply route's ID. A route that is not roam's, or
// malformed, says nothing.
func requestOf(header actor.ReadonlyMessageHeader, sender *actor.PID) (operation string, deadlineMillis int64, ok bool) {
	if header != nil {
		operation = header.Get(HeaderOperation)
		if d := header.Get(HeaderDeadline); d != "" {
			if ms, err := strconv.ParseInt(d, 10, 64); err == nil {
				return operation, ms, true
			}
		}
	}
	if sender == nil || !strings.HasPrefix(sender.Id, replyRoutePrefix) {
		return operation, 0, false
	}
	d, rest, found := strings.Cut(sender.Id[len(replyRoutePrefix):], ".")
	_, op, tokened := strings.Cut(rest, ".")
	ms, err := strconv.ParseInt(d, 10, 64)
	if !found || !tokened || err != nil || op == "" {
		return operation, 0, false
	}
	if operation == "" {
		operation = op
	}
	return operation, ms, true
}

// deadlineGrace tolerates clocks of different nodes that disagree a little:
// a request is skipped only once it is this far past its deadline.
const deadlineGrace = time.Second

// Closed: the incarnation was closed by its owner (PROTOCOL.md §7.9).
const Closed ClosingReason = RelocationOut + 1

// Staged is an incarnation a Spot operation creates on this node: spawned
// with its mailbox staging, so the factory and Started run but no
// application message is dispatched until Open — the activation barrier of
// PROTOCOL.md §7.5 step 11. It is not this node's serving incarnation (Serving,
// Relocate and Local do not see it) until Open.
type Staged struct {
	d   *Driver
	obj *object
}

// Stage spawns an incarnation of key with the given generations. Messages
// that reach its PID before Open wait in its temporary queue. Stage, Open
// and CloseLocal are local and never abandoned half-way: a caller's
// deadline cannot leave a spawned incarnation nobody owns.
func (d *Driver) Stage(ctx context.Context, key location.AuthorityKey, stableType string, generation, ownerGeneration uint64) (*Staged, error) {
	k, ok := d.kind(stableType)
	if !ok {
		return nil, fmt.Errorf("%w: stable type %q is not registered here", roamerr.ErrNotFound, stableType)
	}
	return call(context.Background(), d, func() (*Staged, error) {
		obj := &object{key: key, kind: k, generation: generation, ownerGeneration: ownerGeneration, state: staging}
		if _, err := d.incarnate(obj, true, objectPIDName(key, generation, ownerGeneration)); err != nil {
			return nil, fmt.Errorf("%w: stage %s: %w", roamerr.ErrUnavailable, key, err)
		}
		return &Staged{d: d, obj: obj}, nil
	})
}

// Do runs fn with the application's actor on the actor's goroutine between
// turns (also while staged) and waits for it.
func (s *Staged) Do(ctx context.Context, fn func(a actor.Actor) error) error {
	done := make(chan error, 1)
	obj := s.obj
	if err := obj.mb.Do(func() { done <- fn(obj.inst) }); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	}
}

// Open makes the staged incarnation this node's serving one and dispatches
// first ahead of everything that waited in its temporary queue. If
// firstOperation is not empty, afterFirst runs (on the actor's goroutine)
// once the handler of the message stamped with that HeaderOperation has
// returned: the point at which a cold activation's recovery pointer may go
// (PROTOCOL.md §7.5 step 12). From then on dispatch waits until afterFirst's
// caller calls settled, and a move of the incarnation waits until settled
// says the pointer is gone (or the incarnation ended).
func (s *Staged) Open(ctx context.Context, first []any, firstOperation string, afterFirst func(settled func(pointerGone bool))) error {
	_, err := call(context.Background(), s.d, func() (struct{}, error) {
		obj := s.obj
		if err := s.d.Usable(); err != nil {
			// An ended lifecycle serves nothing: the first messages stay
			// with the activation's recovery root, for a live node.
			return struct{}{}, fmt.Errorf("open %s: %w", obj.key, err)
		}
		// The fields are the actor goroutine's (host.Receive reads them on
		// every turn, Started included): set them there, as the control
		// item that runs before the first message OpenWith releases.
		var turn *firstTurn
		if afterFirst != nil {
			turn = &firstTurn{operation: firstOperation, after: afterFirst}
		}
		if err := obj.mb.Do(func() { obj.first = turn }); err != nil {
			return struct{}{}, fmt.Errorf("%w: open %s: %w", roamerr.ErrUnavailable, obj.key, err)
		}
		if firstOperation != "" {
			obj.flags.set(flagActivating, true)
		}
		if err := obj.mb.OpenWith(first); err != nil {
			return struct{}{}, fmt.Errorf("%w: open %s: %w", roamerr.ErrUnavailable, obj.key, err)
		}
		s.d.putObject(obj)
		s.d.nowServing(obj)
		return struct{}{}, nil
	})
	return err
}

// Discard removes a staged incarnation that will never open: what waited in
// its queue fails loudly — a request is answered Unavailable, a send is
// logged and counted (send_unavailable) — and the actor stops.
func (s *Staged) Discard() {
	obj := s.obj
	held, _ := obj.mb.Discard()
	removed := s.d.unavailableSink(obj, "the incarnation was removed before it opened")
	for _, msg := range held {
		removed(msg)
	}
	s.d.stop(obj)
}

// LocalIncarnation describes this node's serving incarnation of a key.
type LocalIncarnation struct {
	PID             *actor.PID
	Generation      uint64
	OwnerGeneration uint64
}

// Local returns this node's serving incarnation of key, if any. A move of
// key into this node that has not ended is waited for first (bounded by
// ctx): Relocate returns once the commit is visible in the store, so a
// caller that read the record naming this node may ask before the
// arrival serves, and would otherwise be told the object is elsewhere.
func (d *Driver) Local(ctx context.Context, key location.AuthorityKey) (LocalIncarnation, bool, error) {
	if err := d.arrived(ctx, key); err != nil {
		return LocalIncarnation{}, false, err
	}
	type res struct {
		li LocalIncarnation
		ok bool
	}
	r, err := call(ctx, d, func() (res, error) {
		obj := d.objects[key]
		if obj == nil || obj.state != serving {
			return res{}, nil
		}
		return res{LocalIncarnation{PID: obj.pid, Generation: obj.generation, OwnerGeneration: obj.ownerGeneration}, true}, nil
	})
	return r.li, r.ok, err
}

// CloseLocal closes this node's serving incarnation of key with generation
// (PROTOCOL.md §7.9): admission is sealed behind the messages already
// accepted, which still run; timers stop; the application hears
// OnClosing(Closed); then the actor stops, and later messages end as dead
// letters (a stale route for their callers). NotFound when no such
// incarnation serves here; Unavailable while it is moving or being taken
// over here.
func (d *Driver) CloseLocal(ctx context.Context, key location.AuthorityKey, generation uint64) error {
	obj, err := call(context.Background(), d, func() (*object, error) {
		if err := spawn.AdmitClose(key, generation, d.here(key, func() bool { return d.takeovers.has(key) })); err != nil {
			return nil, err
		}
		obj := d.objects[key]
		d.setState(obj, ended)
		obj.closing = true
		return obj, nil
	})
	if err != nil {
		return err
	}
	return d.closeEnded(ctx, obj)
}

// here is what the driver goroutine knows of key's incarnation on this
// node, for spawn's admissions; pending, asked only when none is
// registered, says whether one is on its way to serving here.
func (d *Driver) here(key location.AuthorityKey, pending func() bool) spawn.Here {
	obj := d.objects[key]
	if obj == nil {
		return spawn.Here{Pending: pending()}
	}
	return spawn.Here{
		Present: true, Generation: obj.generation,
		Serving: obj.state == serving, Ended: obj.state == following || obj.state == ended,
		Moving: obj.r().out != nil, Activating: obj.flags.load(flagActivating), Changing: obj.r().changing > 0,
	}
}

// awaitStop stops the local actor pid and waits for its end, within ctx.
// Not Proto.Actor's StopFuture: it gives up after 10 s of real time,
// while an application's Stopping handler may take longer; the wait here
// is the actor's Terminated alone, bounded by ctx.
func (d *Driver) awaitStop(ctx context.Context, pid *actor.PID) error {
	f := actor.NewFuture(d.sys, -1)           // no timeout of its own
	proc, _ := d.sys.ProcessRegistry.Get(pid) // a dead PID's is the dead letter process, which answers Terminated
	proc.SendSystemMessage(pid, &actor.Watch{Watcher: f.PID()})
	d.sys.Root.Stop(pid)
	ended := make(chan struct{})
	go func() { _ = f.Wait(); close(ended) }()
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		d.sys.Root.Stop(f.PID()) // ends the future, and the goroutine waiting on it
		return ctx.Err()
	}
}

// closeEnded runs the close of obj, marked ended and closing on the
// driver goroutine: what it accepted runs, then it stops and leaves the
// objects. DeadlineExceeded when ctx ends first (it stops itself later).
func (d *Driver) closeEnded(ctx context.Context, obj *object) error {
	key := obj.key
	// The marker queues behind every message already accepted, so those
	// turns (and ticks) run first; then timers stop, the application hears
	// OnClosing(Closed), and the actor stops. After the close an operation
	// ends with a stale result (PROTOCOL.md §7.9).
	closed := d.endSink(obj, roamerr.CodeStale, "send_after_close", "the incarnation closed")
	marker := &closeMarker{done: make(chan struct{}), closed: closed, stop: func() { d.stop(obj) }}
	d.sys.Root.Send(obj.pid, marker)
	var err2 error
	select {
	case <-marker.done:
		obj.flags.set(flagStopAllowed, true)
		if err := d.awaitStop(ctx, obj.pid); err != nil {
			err2 = fmt.Errorf("%w: %s is still stopping: %w", roamerr.ErrDeadlineExceeded, key, err)
		}
	case <-ctx.Done():
		// The incarnation is ended and stops itself at the marker.
		err2 = fmt.Errorf("%w: accepted turns of %s still running: %w", roamerr.ErrDeadlineExceeded, key, ctx.Err())
	}
	if err2 != nil {
		return err2
	}
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		d.dropObject(obj)
		return struct{}{}, nil
	})
	// Closed: its state is gone by design, and so is its checkpoint
	// (before the authority is released, so no recovery can find it).
	if obj.cp != nil {
		d.forgetCheckpoint(key, obj.generation, obj.ownerGeneration, obj.kind.StableType)
	}
	return nil
}

// closeMarker ends an incarnation after the turns accepted before it
// (CloseLocal). It never leaves the node.
type closeMarker struct {
	done   chan struct{}
	closed mailbox.Sink // answers what reaches the incarnation after it
	stop   func()
}

// ToWire and FromWire convert between a posted message (a protobuf
// message, or an *actor.MessageEnvelope with sender and headers) and its
// wire envelope. Only protobuf messages cross nodes.
func ToWire(targetID string, posted any) (*messages.Envelope, error) { return toWire(targetID, posted) }

// FromWire is the inverse of ToWire.
func FromWire(env *messages.Envelope) (any, error) { return fromWire(env) }

// Store is the driver's Location Store.
func (d *Driver) Store() location.Store { return d.store }

// Node is the node the driver runs on (its lease decides what it may do).
func (d *Driver) Node() *meshnode.Node { return d.node }

// Usable reports why this node's handle must not be used any more: its
// lifecycle ended (the node stopped, or its owner lease ended), nil
// otherwise. A fenced node is still usable: calls to other nodes go on.
func (d *Driver) Usable() error {
	if d.node.LeaseStatus() == lease.Ended {
		return fmt.Errorf("%w: node %s has stopped or its owner lease ended", roamerr.ErrUnavailable, d.desc.GetNodeRid())
	}
	return nil
}

// servingWithin is serving for a caller with a deadline, on the caller's
// goroutine (never a driver turn: it may wait): a fence — a renewal came
// late, the lease has not ended — is waited out within ctx, as a write
// waits for it (location.Leased), and lifts by itself at the node's next
// renewal; only a caller whose deadline comes first hears it.
func (d *Driver) servingWithin(ctx context.Context) error {
	err := d.serving()
	if errors.Is(err, location.ErrFenced) && d.node.WaitWritable(ctx) == nil {
		err = d.serving()
	}
	return err
}

// serving reports why this node may not start owner work (a spawn, a
// move out) now: its lifecycle ended, or its lease is fenced.
func (d *Driver) serving() error {
	if err := d.Usable(); err != nil {
		return err
	}
	if _, _, err := d.node.WriteLease(); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrUnavailable, err)
	}
	return nil
}

// Descriptor is this node's descriptor.
func (d *Driver) Descriptor() *location.NodeDescriptor { return d.desc }

// System is this node's actor system.
func (d *Driver) System() *actor.ActorSystem { return d.sys }

// Kind returns the kind registered here under stableType.
func (d *Driver) Kind(stableType string) (*Kind, bool) { return d.kind(stableType) }

// ServingCount is the number of incarnations serving on this node, the
// active load a node's capacity bounds (PROTOCOL.md §7.2, placement).
func (d *Driver) ServingCount(ctx context.Context) (int, error) {
	return call(ctx, d, func() (int, error) {
		hosting, _ := d.load()
		return hosting, nil
	})
}

// IncarnationOf names the serving incarnation whose PID is pid.
func (d *Driver) IncarnationOf(ctx context.Context, pid *actor.PID) (location.AuthorityKey, uint64, error) {
	type res struct {
		key location.AuthorityKey
		gen uint64
	}
	r, err := call(ctx, d, func() (res, error) {
		for key, obj := range d.objects {
			if obj.state == serving && obj.pid.Equal(pid) {
				return res{key, obj.generation}, nil
			}
		}
		return res{}, fmt.Errorf("%w: %s is no serving incarnation here", roamerr.ErrNotFound, pid)
	})
	return r.key, r.gen, err
}

// Hosts reports whether this node has an incarnation of key with
// generation that serves, is moving out (also past its cutover), or is
// arriving (a move in that may already have committed this node as owner,
// or a takeover whose record may name this node before its incarnation
// opens).
func (d *Driver) Hosts(key location.AuthorityKey, generation uint64) bool {
	ok, _ := call(context.Background(), d, func() (bool, error) { return d.hosts(key, generation), nil })
	return ok
}

// hosts is Hosts on the driver goroutine.
func (d *Driver) hosts(key location.AuthorityKey, generation uint64) bool {
	if obj := d.objects[key]; obj != nil && obj.generation == generation && (obj.state == serving || obj.state == leaving) {
		return true
	}
	if d.takeovers.has(key) {
		return true
	}
	for _, t := range d.targets {
		if t.key == key {
			return true
		}
		for _, m := range t.members {
			if m.key == key {
				return true
			}
		}
	}
	// Moving out past its cutover: no longer registered, but the record
	// may name this node until the target commits.
	for _, r := range d.sources {
		for _, p := range r.parts {
			if p.obj.key == key && !r.m.Finished() {
				return true
			}
		}
	}
	return false
}
