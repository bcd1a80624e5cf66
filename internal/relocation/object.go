package relocation

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/mailbox"
	"github.com/roamactors/roam/internal/relocation/spawn"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// objectState is what this node does with an incarnation.
type objectState uint8

const (
	serving   objectState = iota // the owner: dispatching
	leaving                      // a move out is in progress
	staging                      // a move in is restoring; nothing dispatched
	following                    // moved away: Message Follow to the next hop
	ended                        // follow over or removed: Unavailable
)

// object is one incarnation of a relocatable object on this node. Fields
// are touched by the driver goroutine only, except mb and inst, which the
// spawn sets before the driver uses them.
type object struct {
	d               *Driver // for endSink (log and metrics) and the stop guard only: the actor goroutine never enters the driver's loop
	key             location.AuthorityKey
	kind            *Kind
	generation      uint64 // ObjectGeneration
	ownerGeneration uint64 // AuthorityOwnerGeneration of this incarnation
	pid             *actor.PID
	mb              *mailbox.Mailbox
	inst            actor.Actor // the application's actor; its goroutine only
	kept            Stateful    // registered by KeepState; its goroutine only
	tm              *timers     // framework timers; the object's goroutine only
	// rare is what only a move, a membership, a session or a SpotWide
	// arrival sets (objectRare); nil for most objects. The driver
	// goroutine only: read it with r(), write it with x().
	rare *objectRare
	// closedSink answers what reaches the incarnation once removed before
	// it opened (Closed), made by the first such message.
	closedSink atomic.Pointer[mailbox.Sink]
	// first: see Staged.Open; nil once the first turn is over (most
	// incarnations keep nothing of it); the object's goroutine only once
	// open.
	first *firstTurn
	// The small fields last, packed (an idle object is 192 bytes, a size
	// class of Go's allocator: a field more costs every idle Spot 16).
	// flags are its atomic booleans (objectFlag), one bit each:
	//
	// flagActivating: a cold activation opened this incarnation and its
	// recovery pointer is not known to be gone from the store yet (set
	// by Staged.Open; cleared by the settled callback of afterFirst once
	// the pointer is gone, or when the incarnation ends). A move waits for
	// it (settled): the pointer travels with the record, and a target
	// would serve on with nobody removing it.
	//
	// flagPointerHeld: the first message has run and its recovery
	// pointer's removal has not landed: dispatch waits (the mailbox gate),
	// so that no second message runs while a later owner could still
	// resume the activation from its first message alone
	// (docs/PROTOCOL.md §7.5 step 12, PROTOCOL.md §7.7): a resume then
	// loses nothing the first message did not.
	//
	// flagStopAllowed: the driver is ending this incarnation
	// (Driver.stop); any other stop is refused.
	flags objectFlags
	// liveAt is its place in the driver's live incarnations, plus one (0:
	// not there); under the driver's liveMu.
	liveAt uint32
	state  objectState
	// closing: CloseLocal ended it and its close marker is queued (the
	// driver goroutine only).
	closing bool
	// clusterInit: ClusterInit reached the actor since its last Started
	// (the actor's goroutine only).
	clusterInit bool
	// arrived: a relocation target spawned it (what its closed queue says).
	arrived bool
	// cp: its checkpoints (nil unless its kind checkpoints; checkpoints.go).
	cp *cpState
	// hc is the context its actor gets (hostactor.go); the object's
	// goroutine only.
	hc hostContext
}

// objectFlag is a bit of object.flags.
type objectFlag uint32

const (
	flagActivating objectFlag = 1 << iota
	flagPointerHeld
	flagStopAllowed
)

// objectFlags are atomic booleans in one word: three atomic.Bool fields
// cost every idle Spot 8 bytes more.
type objectFlags struct{ v atomic.Uint32 }

func (f *objectFlags) load(b objectFlag) bool { return f.v.Load()&uint32(b) != 0 }

// set sets b to on and reports whether it was set before.
func (f *objectFlags) set(b objectFlag, on bool) (was bool) {
	var old uint32
	if on {
		old = f.v.Or(uint32(b))
	} else {
		old = f.v.And(^uint32(b))
	}
	return old&uint32(b) != 0
}

// objectRare holds an object's fields that most objects never set: an
// idle Spot's heap is mostly its object (see the struct's size).
type objectRare struct {
	// out is the move out of this node in progress, from its start (before
	// the seal) until it ends.
	out *sourceRun
	// member is the User Spot incarnation this Actor is a member of, as
	// its record last written here says (nil: none, or an Entry Spot). A
	// SpotWide move finds its members by it.
	member *messages.Membership
	// session is the client Session this Actor is bound to (nil: none):
	// set at its spawn, carried by every move (docs/SESSIONS.md).
	session *messages.SessionBinding
	// opening is set while this SpotWide member arrived and its queue is
	// not open yet (closed then).
	opening *memberOpening
	// offeredOwner is the highest AuthorityOwnerGeneration a move out of
	// this incarnation has offered its target (Relocate).
	offeredOwner uint64
	// joining counts the joins into this User Spot admitted and not
	// finished (JoinSpot, SpawnMember); a SpotWide move does not start
	// while one is on its way.
	joining int32
	// changing counts membership changes of this Actor under way here
	// (JoinSpot, LeaveSpot); no move of it starts meanwhile.
	changing int32
}

// noRare is what r() reads for an object without rare fields; never
// written.
var noRare objectRare

// r is the object's rare fields, to read (all zero when it has none).
func (o *object) r() *objectRare {
	if o.rare != nil {
		return o.rare
	}
	return &noRare
}

// x is the object's rare fields, to write (made on first use).
func (o *object) x() *objectRare {
	if o.rare == nil {
		o.rare = &objectRare{}
	}
	return o.rare
}

// An object is also what its incarnation's host actor (hostactor.go) runs
// each turn around, innermost of the kind's middleware (receive): it
// refuses a followed message whose ObjectGeneration is not this
// incarnation's (PROTOCOL.md §5.14), answers the framework's own
// RouteBarrier and GrainActivate, drops ticks of cancelled timers,
// delivers cluster.ClusterInit after Started when the node is a Proto.Actor
// cluster member (ClusterKind kinds deliver it themselves), and hands every
// other message to the application. The host context finds it for Get;
// its mailbox has it as its hooks.

// afterTurn: the turn of the first message is over — handled, refused in
// receive (a request past its deadline is answered DeadlineExceeded and
// never runs), or failed by a panic the supervisor handles: either way
// the activation's recovery pointer may go, and must, or a later owner
// would replay a message its caller was told failed, and the incarnation
// could never move.
func (o *object) afterTurn(hd actor.ReadonlyMessageHeader) {
	if o.first == nil {
		return
	}
	if hd != nil && hd.Get(HeaderOperation) == o.first.operation {
		done := o.first.after
		// Kept no longer than needed (an idle Spot's heap).
		o.first = nil
		o.flags.set(flagPointerHeld, true) // before the next turn's gate check
		done(o.pointerSettled)
	}
}

// pointerSettled ends the wait for the recovery pointer's removal:
// dispatch goes on. pointerGone: the removal landed, the record no longer
// names this activation, or the removal gave up (logged) — a move may
// start. Otherwise a close is releasing record and pointer together: the
// incarnation must run what it accepted, but a move still waits (it would
// find the object closing, and the close would put the pointer back).
// Safe to call more than once, from any goroutine.
func (o *object) pointerSettled(pointerGone bool) {
	if pointerGone {
		o.moveMayStart()
	}
	if o.flags.set(flagPointerHeld, false) && o.mb != nil {
		o.mb.Wake()
	}
}

// moveMayStart releases the moves waiting for the activation to settle:
// the pointer is gone, or the incarnation ended (they then find it so).
func (o *object) moveMayStart() {
	settleMu.Lock()
	settledNow := o.flags.set(flagActivating, false)
	if ch := o.d.settling[o]; settledNow && ch != nil {
		close(ch)
		delete(o.d.settling, o)
	}
	settleMu.Unlock()
	if settledNow {
		o.captureHeldBack()
	}
}

// settled returns a channel closed once the cold activation's recovery
// pointer is gone (at once if it is).
func (o *object) settled() <-chan struct{} {
	settleMu.Lock()
	defer settleMu.Unlock()
	if !o.flags.load(flagActivating) {
		return closedChan
	}
	ch := o.d.settling[o]
	if ch == nil {
		if o.d.settling == nil {
			o.d.settling = map[*object]chan struct{}{}
		}
		ch = make(chan struct{})
		o.d.settling[o] = ch
	}
	return ch
}

// settleMu guards every Driver's settling.
var settleMu sync.Mutex

// firstTurn is a cold activation's first message, until its turn is over:
// its operation id, and what runs then (Staged.Open).
type firstTurn struct {
	operation string
	after     func(settled func(pointerGone bool))
}

// closedChan is a channel that is closed.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// respond answers sender, if there is one.
func respond(c actor.Context, sender *actor.PID, msg any) {
	if sender != nil {
		c.ActorSystem().Root.Send(sender, msg)
	}
}

// receive is roam's part of a turn (host.Receive): the message's checks,
// roam's own messages, and the application's actor's turn (handle).
func (o *object) receive(h *host, c actor.Context, hd actor.ReadonlyMessageHeader, msg any, sender *actor.PID) {
	if hd != nil {
		if g := hd.Get(HeaderGeneration); g != "" && g != strconv.FormatUint(o.generation, 10) {
			// The text goes to the caller: it names only the generation the
			// caller sent, never the current one.
			why := fmt.Sprintf("the message names generation %s of %s, which is not the one serving", g, o.key.ID)
			o.d.endSink(o, roamerr.CodeInvalidOperation, "send_invalid_generation", why)(
				&actor.MessageEnvelope{Message: msg, Sender: sender, Header: hd.ToMap()})
			return
		}
	}
	if sender != nil {
		if _, ms, ok := requestOf(hd, sender); ok && o.d.clock.Now().After(time.UnixMilli(ms).Add(deadlineGrace)) {
			respondFailure(c.ActorSystem(), sender, msg, roamerr.CodeDeadlineExceeded, o.key.ID,
				"the request's deadline passed before it was dispatched; not run")
			return
		}
	}
	switch m := msg.(type) {
	case *actor.Started:
		// Also after a restart by the supervisor: the actor is a new
		// instance then, and what the old one registered is gone with it.
		o.inst, o.kept, o.clusterInit = h.inner, nil, false
		o.handle(h, nil)
		if pc := o.d.node.ProtoActorCluster(); pc != nil && !o.kind.ClusterKind {
			o.clusterInit = true
			o.handle(h, actor.WrapEnvelope(&pcluster.ClusterInit{Identity: o.clusterIdentity(), Cluster: pc}))
		}
	case *pcluster.ClusterInit:
		// Once per instance: Props from cluster.NewKind given to NewKind
		// (not FromClusterKind) would deliver it a second time, and a
		// generated grain would make a new implementation in its place.
		if !o.clusterInit {
			o.clusterInit = true
			o.handle(h, nil)
		}
	case *messages.RouteBarrier:
		respond(c, sender, m) // the caller's old route is drained up to here
	case *messages.GrainActivate:
		respond(c, sender, m) // the grain is active; the caller's own message follows
	case *messages.TimerTick:
		if o.tm != nil && o.tm.onTick(m) && o.inst != nil {
			o.handle(h, nil)
			o.turnEnded()
		} // else a tick of a cancelled timer
	default:
		if o.inst != nil { // nil once moved away: the incarnation only forwards
			if hd != nil {
				if to := noticePID(hd.Get(HeaderDispatchNotice)); to != nil {
					c.ActorSystem().Root.Send(to, &messages.RouteBarrier{})
				}
				if o.d.cfg.Edges != nil {
					if tag := hd.Get(HeaderFrom); tag != "" {
						o.recordEdge(tag)
					}
				}
			}
			if o.d.cfg.Edges != nil {
				o.sampleLoad()
			}
			o.handle(h, nil)
			o.turnEnded()
		}
	}
}

// handle runs the application's actor's turn: on the context's own
// message, or on delivered (roam's ClusterInit).
func (o *object) handle(h *host, delivered *actor.MessageEnvelope) {
	if delivered == nil { // every turn but one ClusterInit per instance
		h.inner.Receive(&o.hc)
		return
	}
	o.hc.delivered = delivered
	defer func() { o.hc.delivered = nil }()
	h.inner.Receive(&o.hc)
}

// Intercept (mailbox.Hooks) takes roam's own close marker from the mailbox before the
// actor's receiver middleware sees it: an application middleware that
// passes on only the messages it knows must not keep an incarnation from
// closing.
func (o *object) Intercept(msg any) bool {
	m, ok := actor.UnwrapEnvelopeMessage(msg).(*closeMarker)
	if !ok {
		return false
	}
	if o.tm != nil {
		o.tm.stopAll()
	}
	if cl, ok := o.inst.(Closing); ok {
		func() {
			defer func() {
				if p := recover(); p != nil {
					o.d.log.Error().Str("event", "on_closing_panicked").Str("object_id", o.key.ID).Interface("panic", p).
						Msg("the application's OnClosing panicked; the incarnation closes anyway")
				}
			}()
			cl.OnClosing(Closed)
		}()
	}
	// Seal after this turn: what was queued behind the marker, and what
	// comes later, is answered by the closed sink, never dropped; then
	// the actor stops. A final seal: a control item queued before it that
	// fails (a capture) suspends the actor, and the close must still end
	// it, as an ended lifecycle's seal would be refused behind this one.
	if err := o.mb.SealFinal(func(saved []any) {
		for _, msg := range saved {
			m.closed(msg)
		}
		_, _ = o.mb.Redirect(m.closed)
		m.stop()
		close(m.done)
	}); err != nil {
		m.stop()
		close(m.done)
	}
	return true
}

// GateOpen (mailbox.Hooks): the lease fence gates every dispatch —
// nothing of the application runs on a node whose owner lease is not
// provably in force. So does a cold activation's recovery pointer between
// the first handler's return and the removal's landing (pointerHeld).
func (o *object) GateOpen() bool { return !o.flags.load(flagPointerHeld) && o.d.node.Valid() }

// Closed (mailbox.Hooks) answers what reaches an incarnation removed
// before it opened (a staged one, a relocation target's temporary queue;
// PROTOCOL.md §6.3, §5.14): Unavailable, for as long as messages may still
// follow to it.
func (o *object) Closed(msg any) {
	sink := o.closedSink.Load()
	if sink == nil {
		why := "the incarnation was removed before it opened"
		if o.arrived {
			why = "the relocation target was removed before it opened"
		}
		// One sink for all: its log says the first send, then a line a
		// second (endSink). Concurrent first posts may each make one;
		// the first stored is the one all use.
		s := o.d.endSink(o, roamerr.CodeUnavailable, "send_unavailable", why)
		if !o.closedSink.CompareAndSwap(nil, &s) {
			sink = o.closedSink.Load()
		} else {
			sink = &s
		}
	}
	(*sink)(msg)
}

// StopAllowed (mailbox.Hooks): only the driver ends an incarnation
// (Driver.stop); a stop from anywhere else — the application, a remote
// peer — would leave the store naming this node for an object it no
// longer serves.
func (o *object) StopAllowed() bool { return o.flags.load(flagStopAllowed) }

// StopRefused (mailbox.Hooks) reports a refused stop.
func (o *object) StopRefused(msg any) {
	o.d.log.Warn().Str("event", "stop_refused").Str("object_id", o.key.ID).Str("message_type", fmt.Sprintf("%T", actor.UnwrapEnvelopeMessage(msg))).
		Msg("a stop of a relocatable incarnation from outside roam was refused; roam ends incarnations itself (Close, CloseSelf, moves)")
}

// clusterIdentity is the incarnation's Proto.Actor cluster identity: its
// ID, of its stable type as the kind. A grain's Instance Spot ID is
// "<kind>/<identity>" (spot.GrainSpotID): its identity is the part after
// the kind.
func (o *object) clusterIdentity() *pcluster.ClusterIdentity {
	id := o.key.ID
	if o.key.Kind == location.KindInstanceSpot {
		id = strings.TrimPrefix(id, o.kind.StableType+"/")
	}
	return pcluster.NewClusterIdentity(id, o.kind.StableType)
}

// stateful is what PreserveState captures: the Stateful registered with
// KeepState, else the actor if it is one; nil if neither.
func (o *object) stateful() Stateful {
	if o.kept != nil {
		return o.kept
	}
	s, _ := o.inst.(Stateful)
	return s
}

// captureState runs the policy's capture on the object's goroutine.
func (o *object) captureState(p preserveStateWith) ([]byte, error) {
	if _, ok := p.adapter.(statefulAdapter); ok {
		s := o.stateful()
		if s == nil {
			return nil, errNotStateful
		}
		return s.CaptureState()
	}
	return p.adapter.Capture(o.inst)
}

// restoreState runs the policy's restore on the object's goroutine.
func (o *object) restoreState(p preserveStateWith, state []byte) error {
	if _, ok := p.adapter.(statefulAdapter); ok {
		s := o.stateful()
		if s == nil {
			return errNotStateful
		}
		return s.RestoreState(state)
	}
	return p.adapter.Restore(o.inst, state)
}

// KeepState registers s as the state a PreserveState kind's incarnation
// carries across moves. Call it from the actor (c is its context), once
// its state exists: a generated grain's implementation calls it in Init,
// with the GrainContext. A later call replaces the earlier one.
// InvalidOperation outside a relocatable incarnation.
func KeepState(c actor.Context, s Stateful) error {
	obj, ok := c.Get(hostExtensionID).(*object)
	if !ok {
		return fmt.Errorf("%w: KeepState outside a relocatable incarnation", roamerr.ErrInvalidOperation)
	}
	obj.kept = s
	return nil
}

// RespondFailure answers request, which roam could not deliver, with the
// error's class (failure.Answer).
func RespondFailure(sys *actor.ActorSystem, to *actor.PID, request any, target string, err error) {
	respondFailure(sys, to, request, roamerr.Code(err), target, err.Error())
}

// respondFailure answers request, which roam could not deliver, in its
// object's place: a grain request as a generated grain client reads a
// failure (failure.Answer); a one-way send has nobody to answer and is
// reported by the caller's log line.
func respondFailure(sys *actor.ActorSystem, to *actor.PID, request any, code, target, detail string) {
	if to == nil {
		return
	}
	sys.Root.Send(to, failure.Answer(request, code, target, detail))
}

// DeliveryError turns the reply roam answered in an object's place into
// a typed error, nil for any other reply (failure.Error).
func DeliveryError(reply any) error { return failure.Error(reply) }

// Spawn creates a relocatable Actor of a registered kind on this node: it
// claims the Actor's record (Ready, owned here, member of this node's
// Entry Spot) by create-only CAS, then starts it.
func (d *Driver) Spawn(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return d.spawn(ctx, location.Key(location.KindActor, id), stableType, nil)
}

// SpawnMember creates a relocatable Actor on this node as a member of the
// User Spot incarnation membership names. spotAt is the Spot's record as
// read: the Actor's record is written in one transaction with the Spot's
// record at that version, so a membership is only accepted while the Spot
// is active with that generation (PROTOCOL.md §7.10). A Spot that changed
// meanwhile is Stale.
func (d *Driver) SpawnMember(ctx context.Context, stableType, id string, membership *messages.Membership, spotAt location.Versioned) (*actor.PID, error) {
	done, err := d.joinBegins(ctx, membership, spotAt.Record.GetStableType(), spotAt.Record.GetOwner().GetNodeRid())
	if err != nil {
		return nil, err
	}
	defer done()
	return d.spawn(ctx, location.Key(location.KindActor, id), stableType, &memberOf{membership, spotAt})
}

// arrived waits, within ctx, until no move of key into this node is
// under way: a Spot whose move here committed opens just after (a join
// right after its Relocate returned must not find it missing), and no
// member of a SpotWide Spot that arrived here is still waiting to open.
func (d *Driver) arrived(ctx context.Context, key location.AuthorityKey) error {
	for {
		var opening *memberOpening
		done, err := call(ctx, d, func() (<-chan struct{}, error) {
			t := d.arriving(key)
			if t == nil {
				// A SpotWide move's member serves only once the Spot's
				// RelocationReady callback ran (openMembers), just after
				// the run ended.
				if o := d.objects[key]; o != nil && o.r().opening != nil {
					opening = o.r().opening
					return o.r().opening.done, nil
				}
				return nil, nil
			}
			ch := make(chan struct{})
			t.onDone = append(t.onDone, func() { close(ch) })
			return ch, nil
		})
		if err != nil || done == nil {
			return err
		}
		if err := opening.refuseReentry(key); err != nil {
			return err
		}
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("%w: %s is arriving here: %w", roamerr.ErrDeadlineExceeded, key, ctx.Err())
		}
	}
}

// joinBegins registers a join into the User Spot incarnation m on its
// local incarnation until done is called: a SpotWide move of that Spot
// does not start meanwhile, and a join does not start while it moves
// (PROTOCOL.md §5.15). A SpotWide Spot takes members only on its own node
// (owner), where its members live.
func (d *Driver) joinBegins(ctx context.Context, m *messages.Membership, spotType, owner string) (done func(), err error) {
	noop := func() {}
	if k, ok := d.kind(spotType); !ok || !k.SpotWide {
		return noop, nil
	}
	if owner != d.desc.GetNodeRid() {
		return nil, fmt.Errorf("%w: User Spot %q is SpotWide: its members live on its node; spawn them there, or JoinSpot", roamerr.ErrInvalidOperation, m.GetSpotId())
	}
	if err := d.arrived(ctx, location.Key(location.KindUserSpot, m.GetSpotId())); err != nil {
		return nil, err
	}
	// Not bounded by ctx: a call given up would still count the join, and
	// no one would count it off (the Spot could never move again).
	spot, err := call(context.Background(), d, func() (*object, error) {
		spot := d.objects[location.Key(location.KindUserSpot, m.GetSpotId())]
		switch {
		case spot == nil || spot.state != serving || spot.generation != m.GetSpotGeneration():
			return nil, fmt.Errorf("%w: User Spot %q is not served here at generation %d", roamerr.ErrStale, m.GetSpotId(), m.GetSpotGeneration())
		case spot.r().out != nil:
			return nil, fmt.Errorf("%w: User Spot %q is moving", roamerr.ErrUnavailable, m.GetSpotId())
		}
		spot.x().joining++
		return spot, nil
	})
	if err != nil {
		return nil, err
	}
	return func() {
		d.loop.Post(func() { spot.x().joining-- })
	}, nil
}

type memberOf struct {
	membership *messages.Membership
	spotAt     location.Versioned
}

// SpawnInstanceSpot creates an Instance Spot of a registered kind on this
// node: no membership, owned here (PROTOCOL.md §2.1). Cold activation by a
// first message comes with the Spot manager.
func (d *Driver) SpawnInstanceSpot(ctx context.Context, stableType, spotID string) (*actor.PID, error) {
	return d.spawn(ctx, location.Key(location.KindInstanceSpot, spotID), stableType, nil)
}

func (d *Driver) spawn(ctx context.Context, key location.AuthorityKey, stableType string, member *memberOf) (*actor.PID, error) {
	return d.spawnWith(ctx, key, stableType, member, nil, nil)
}

// spawnWith is spawn; incarnated, if set, runs on the driver goroutine
// right after the incarnation started, before it is registered: what it
// sends the incarnation comes before anything a caller that learns the
// PID afterwards sends.
// newGeneration is a new incarnation's ObjectGeneration: the clock's
// nanoseconds, and above every generation this driver issued before, so
// two spawns within one tick of the clock (a logical clock stands still)
// never share one.
func (d *Driver) newGeneration() uint64 {
	for {
		last := d.lastGeneration.Load()
		g := activation.NewGeneration(last, d.clock.Now())
		if d.lastGeneration.CompareAndSwap(last, g) {
			return g
		}
	}
}

func (d *Driver) spawnWith(ctx context.Context, key location.AuthorityKey, stableType string, member *memberOf, session *messages.SessionBinding, incarnated func(*object)) (*actor.PID, error) {
	if err := d.servingWithin(ctx); err != nil {
		return nil, err
	}
	k, ok := d.kind(stableType)
	if err := spawn.Admit(key, stableType, ok); err != nil {
		return nil, err
	}
	// A new incarnation: an ID spawned again after a delete must not
	// reuse a generation, or its PIDs would reach the new one and collide
	// with the old one's forwarders (PROTOCOL.md §2.3).
	generation := d.newGeneration()
	sp := spawn.Spec{Key: key, StableType: stableType, Generation: generation, Owner: d.owner(),
		PreservesState: PreservesState(k.Policy), Session: session, EntrySpotID: d.desc.GetEntrySpotId()}
	if member != nil {
		sp.Member, sp.SpotAt = member.membership, member.spotAt
	}
	rec, ops := sp.Create()
	// The Actor holds a capacity slot of this node from its first record
	// on (PROTOCOL.md §7.12).
	vers, _, werr := d.slots.Take(ctx, []location.AuthorityKey{key}, false, func(slots []uint32) []location.Op {
		WithSlot(rec, slots, 0)
		return ops
	})
	step, err := sp.Wrote(werr)
	if step == spawn.ReadBack {
		if vers, err = d.spawnLanded(sp, rec, werr); err != nil {
			err = sp.Failure(err)
		}
	}
	if err != nil {
		return nil, err
	}
	// The record is committed: from here the incarnation starts whatever
	// the caller's context does (a posted turn runs once posted).
	pid, err := call(context.Background(), d, func() (*actor.PID, error) {
		obj := &object{key: key, kind: k, generation: generation, ownerGeneration: 1}
		if member != nil {
			obj.x().member = member.membership
		}
		pid, err := d.incarnate(obj, false, objectPIDName(key, generation, 1))
		if err != nil {
			return nil, fmt.Errorf("%w: spawn %s: %w", roamerr.ErrInvalidOperation, key, err)
		}
		if incarnated != nil {
			incarnated(obj)
		}
		d.putObject(obj)
		return pid, nil
	})
	if err != nil {
		// Nothing serves the record it committed: take it back.
		if r := d.deleteRecord(key, location.Versioned{Key: key, Version: vers[0], Record: rec}); r.err != nil {
			err = errors.Join(err, r.err)
		}
		return nil, err
	}
	return pid, nil
}

// spawnLanded is a spawn's record write after an indeterminate answer
// (cause): the version it has when the store holds exactly rec, else the
// error to return.
func (d *Driver) spawnLanded(sp spawn.Spec, rec *location.Record, cause error) ([]location.StoreVersion, error) {
	// Until a read answers: a record that landed must be served.
	for try := 1; ; try++ {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.RestoreTimeout)
		v, err := d.store.Read(ctx, sp.Key)
		cancel()
		switch spawn.Read(v, err, rec) {
		case spawn.Absent:
			go d.removeLateSpawn(sp.Key, rec)
			return nil, cause
		case spawn.Landed:
			return []location.StoreVersion{v.Version}, nil
		case spawn.Taken:
			return nil, sp.Exists()
		}
		if !d.pauseUnlessStopped(handoff.StorePause(try)) {
			return nil, errors.Join(cause, err)
		}
	}
}

// removeLateSpawn watches for the record rec of a spawn that was given up
// (spawn.Watch) and deletes it should it land late, loudly.
func (d *Driver) removeLateSpawn(key location.AuthorityKey, rec *location.Record) {
	w := spawn.NewWatch(d.clock.Now())
	for {
		pause, ok := w.Next(d.clock.Now())
		if !ok || !d.pauseUnlessStopped(pause) {
			return
		}
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.RestoreTimeout)
		v, err := d.store.Read(ctx, key)
		cancel()
		switch spawn.LateRead(v, err, rec) {
		case spawn.Leave:
			return
		case spawn.Remove:
			d.log.Warn().Str("event", "late_spawn_removed").Str("object_id", key.ID).
				Msg("a spawn given up after an indeterminate store write landed late; its record, which nothing serves, is deleted")
			d.deleteRecord(key, v)
			return
		}
	}
}

// ClosingReason says why an incarnation closes.
type ClosingReason int

const (
	// RelocationOut: the object moved to another node; this incarnation
	// only forwards now (PROTOCOL.md §5.13).
	RelocationOut ClosingReason = iota + 1
)

// Closing is implemented by an application actor that wants to know when
// its incarnation closes. OnClosing runs on the actor's goroutine.
type Closing interface {
	OnClosing(reason ClosingReason)
}

func (d *Driver) owner() *messages.Owner {
	return location.OwnerOf(d.desc)
}

// Resolve reads the owner of key from the store (consistently) and returns
// the PID of its current incarnation.
func (d *Driver) Resolve(ctx context.Context, key location.AuthorityKey) (*actor.PID, error) {
	return d.lookup(ctx, key) // the look-up a redelivery makes (redelivery.Lookup)
}

// nodeAddress finds a node's remote address through its descriptor:
// NotFound when the store has none (the node never existed, or is gone).
func (d *Driver) nodeAddress(ctx context.Context, mesh, rid string) (string, error) {
	n, err := d.nodeDescriptor(ctx, mesh, rid)
	return n.GetAddress(), err
}

func (d *Driver) nodeDescriptor(ctx context.Context, mesh, rid string) (*location.NodeDescriptor, error) {
	if rid == d.desc.GetNodeRid() {
		return d.desc, nil
	}
	n, err := d.store.ReadNode(ctx, location.NodeKey{Mesh: mesh, NodeRid: rid})
	if err != nil {
		if errors.Is(err, location.ErrNotFound) {
			return nil, fmt.Errorf("%w: no node %s in mesh %q", roamerr.ErrNotFound, rid, mesh)
		}
		return nil, roamerr.Keep(roamerr.ErrUnavailable, "node "+rid, err)
	}
	return n.Node, nil
}

// moveTarget is nodeAddress for a move's target: a node whose descriptor
// says DRAINING is refused at once (ErrNodeDraining), before anything
// seals; one that starts draining later refuses the capability query.
//
// The descriptor read is kept for targetCacheAge: a drain sends hundreds of
// moves a second to the same few nodes, and the target refuses a move it
// cannot take anyway (its capability answer), so a descriptor a moment old
// decides nothing the target does not check again.
func (d *Driver) moveTarget(ctx context.Context, rid string) (string, error) {
	n, ok := d.targetCache.get(rid, d.clock.Now())
	if !ok {
		var err error
		if n, err = d.nodeDescriptor(ctx, d.desc.GetMesh(), rid); err != nil {
			return "", err
		}
		d.targetCache.put(rid, n, d.clock.Now())
	}
	if n.GetStatus() == messages.NodeStatus_NODE_STATUS_DRAINING {
		return "", fmt.Errorf("%w: %w: node %s", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, rid)
	}
	return n.GetAddress(), nil
}

// followSink forwards a message that reached an incarnation which has moved
// away, keeping sender and headers, with one more hop (PROTOCOL.md §5.14).
//
// A message past the hop limit is not sent on: it goes to the owner the
// store names (redeliver). Neither is a message whose next hop's
// connection ended (its node stopped after a drain, or was cut off):
// Proto.Actor would dial it again for seconds and then drop what it held,
// so a request could only end at its caller's deadline. Once one message
// went through the store, every later one of this incarnation does too,
// behind it: one sent on directly could overtake it. The first one waits
// for a RouteBarrier down the next hop, if still connected, so nothing
// forwarded earlier is overtaken either. Hop counts of one caller's
// messages differ (the saved work and the relay of a move do not count
// one), so a later message can reach the limit where an earlier one still
// follows: without the barrier it would be delivered first.
//
// Whichever way a message goes on, its sender's node is told (OnFollow) that
// its route is followed: a route left cached to this incarnation would keep
// every later message of that sender coming here, the Message Follow would
// never fall quiet, and a drained node's stop would wait for it in vain.
func (d *Driver) followSink(obj *object, next *actor.PID, nextRid string) mailbox.Sink {
	// viaStore: the store path began; hopLeft: because the next hop left
	// (only the log line differs).
	var viaStore, hopLeft atomic.Bool
	return func(msg any) {
		d.lastFollow.Store(d.clock.Now().UnixNano())
		env, hops := withFollowHeaders(msg, obj.generation)
		direct := false
		switch {
		case viaStore.Load():
		case hops > MaxFollowHops:
		case d.Departed(next.Address, nextRid):
			hopLeft.Store(true)
		default:
			direct = true
			d.sys.Root.Send(next, env)
		}
		if !direct {
			r := &redeliver{key: obj.key, from: obj.ownerGeneration, env: env}
			if hopLeft.Load() {
				r.peerDown = next.Address
			}
			if viaStore.CompareAndSwap(false, true) && !d.ConnectionEnded(next.Address) {
				r.drainFirst = next
			}
			d.sys.Root.Send(d.self, r)
		}
		if d.cfg.OnFollow != nil {
			d.cfg.OnFollow(obj.key, env)
		}
	}
}

// MaxFollowHops bounds Message Follow (PROTOCOL.md §5.14).
const MaxFollowHops = 8

// unavailableSink ends every message to an incarnation that no longer
// follows: requests get an Unavailable DeliveryFailed, sends are logged.
func (d *Driver) unavailableSink(obj *object, why string) mailbox.Sink {
	return d.endSink(obj, roamerr.CodeUnavailable, "send_unavailable", why)
}

// endSink ends every message that reaches an incarnation that will never
// handle it: a request gets DeliveryFailed with code, a send is logged as
// event. Nothing is dropped silently.
//
// Every send is counted (roam.relocation.sends_undelivered); the log says
// the first one of an object, then at most one line per second with how
// many more there were: a busy object cut off by a store outage receives
// thousands of sends a second, and a line for each buried everything else
// (a 25 s Consul pause under the chat wrote 267,759 of them).
func (d *Driver) endSink(obj *object, code, event, why string) mailbox.Sink {
	lg := &sendLog{}
	logged := func(more int, m any) {
		ev := d.log.Warn().Str("event", event).Str("object_id", obj.key.ID)
		if m != nil {
			ev = ev.Str("message_type", typeName(m))
		}
		ev.Int("more_sends", more).Msg(why)
	}
	// flush writes the summary line of the sends held back, if any; the
	// timer's, or Shutdown's (the process may exit before the timer).
	flush := func() {
		lg.Lock()
		more := lg.more
		if lg.flush != nil {
			lg.flush.Stop()
		}
		lg.more, lg.flush, lg.at = 0, nil, machine.Real.Now() // log pacing: real time
		lg.Unlock()
		d.sendLogs.Delete(lg)
		if more > 0 {
			logged(more, nil)
		}
	}
	return func(msg any) {
		_, m, sender := actor.UnwrapEnvelope(msg)
		if sender != nil {
			respondFailure(d.sys, sender, m, code, obj.key.ID, why)
			return
		}
		if _, ok := m.(*messages.TimerTick); ok {
			return // the incarnation's own timer, not a caller's send
		}
		d.metrics.sendUndelivered(event)
		respondFailure(d.sys, noticeOf(msg), nil, code, obj.key.ID, why)
		lg.Lock()
		defer lg.Unlock()
		if now := machine.Real.Now(); now.Sub(lg.at) >= time.Second {
			lg.at = now
			logged(0, m)
			return
		}
		lg.more++
		if lg.flush == nil {
			lg.flush = machine.Real.AfterFunc(machine.Until(machine.Real, lg.at.Add(time.Second)), flush)
			d.sendLogs.Store(lg, flush)
		}
	}
}

// sendLog is one endSink's log summary: when its last line was written,
// and how many sends it holds back for the next.
type sendLog struct {
	sync.Mutex
	at    time.Time
	more  int
	flush machine.Timer
}

// FlushSendLogs writes every summary line held back now (endSink): before
// the process may exit.
func (d *Driver) FlushSendLogs() {
	d.sendLogs.Range(func(_, f any) bool {
		f.(func())()
		return true
	})
}

// noticeOf is the dispatch notice route of a posted send that went with a
// cold activation (HeaderDispatchNotice): roam's loud failure of such a
// send is answered there too, so its waiting caller learns it. nil for
// any other message.
func noticeOf(msg any) *actor.PID {
	if e, ok := msg.(*actor.MessageEnvelope); ok && e.Header != nil {
		return noticePID(e.Header.Get(HeaderDispatchNotice))
	}
	return nil
}

func typeName(m any) string {
	if pm, ok := m.(proto.Message); ok {
		return string(pm.ProtoReflect().Descriptor().FullName())
	}
	return fmt.Sprintf("%T", m)
}

// Serving reports whether this node runs the serving incarnation of key.
func (d *Driver) Serving(ctx context.Context, key location.AuthorityKey) (bool, error) {
	return call(ctx, d, func() (bool, error) {
		obj := d.objects[key]
		return obj != nil && obj.state == serving, nil
	})
}

// targetCacheAge is how long moveTarget trusts a descriptor it read.
const targetCacheAge = time.Second

// descriptorCache keeps the descriptors moveTarget read, by node RID.
type descriptorCache struct {
	mu sync.Mutex
	m  map[string]cachedDescriptor
}

type cachedDescriptor struct {
	node *location.NodeDescriptor
	at   time.Time
}

func (c *descriptorCache) get(rid string, now time.Time) (*location.NodeDescriptor, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[rid]
	if !ok || now.Sub(e.at) > targetCacheAge {
		return nil, false
	}
	return e.node, true
}

func (c *descriptorCache) put(rid string, n *location.NodeDescriptor, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedDescriptor{}
	}
	for k, e := range c.m {
		if now.Sub(e.at) > targetCacheAge {
			delete(c.m, k)
		}
	}
	c.m[rid] = cachedDescriptor{node: n, at: now}
}
