package relocation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation/budget"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Outcome is what Relocate reports about one move, as the source saw it.
type Outcome struct {
	RelocationID uint64
	Key          location.AuthorityKey
	From, To     string // node RIDs
	Bytes        uint64
	Chunks       uint32
	// Phase timestamps on the source.
	Requested, Sealed, RelayReady, CutoverSent, Committed time.Time
	// Pause is Sealed → Committed as the source observes it (the target
	// opens dispatch right after its commit; Event.Pause is the target's
	// exact figure).
	Pause time.Duration
}

// sourceRun is one move out of this node.
type sourceRun struct {
	m    *handoff.Source
	wire wireIdentity                            // what the run's messages carry
	run  *sourcerun.Run[any, location.Versioned] // the effect interpreter
	obj  *object                                 // the object the move names: parts[0].obj
	// parts are the move's participants, the named object first; a
	// SpotWide move of a User Spot has its members after it (PROTOCOL.md
	// §5.15), every other move one part.
	parts     []*sourcePart
	target    *messages.NodeRef
	targetPID *actor.PID           // the target's relocation actor
	join      *messages.Membership // the User Spot a Join moves the Actor into, or nil
	// idleOnly: admitted only at an idle seal, with no timer due within
	// idleFor (RelocateIfIdle).
	idleOnly bool
	idleFor  time.Duration
	ticket   []byte // the move ticket of the target's capability answer
	// prepareSent: the Restore request (with the ticket) went out.
	prepareSent bool
	// captures: the parts' captures after the seal, until the payload is
	// encoded.
	captures []capturedPart
	waiter   chan sourceResult
	// decided carries what the move's own confirmation reads showed
	// after the cutover (one value; Relocate waits on it rather than
	// watching the record a second time).
	decided chan commitShown
	// versionHint: the record version the target's relay-ready named
	// (messages.RelayReady), for the first commit confirmation.
	versionHint uint64
	// committed is closed when the target says its commit applied
	// (messages.OwnerCommitted), while the first confirmation waits.
	committed chan struct{}
	outcome   Outcome
	deadline  time.Time
}

// sourcePart is one participant of a move out of this node.
type sourcePart struct {
	// Part is its share the interpreter keeps: sealed, captured, the
	// saved work, the relayed messages and the holds.
	sourcerun.Part[any]
	obj      *object
	newOwner uint64     // AuthorityOwnerGeneration the target will write
	next     *actor.PID // the incarnation on the target
	nextRid  string     // the target's node RID (its lifecycle: PeerLeaving)
	// checkpoint is what the seal found of its stored checkpoint, for
	// the Restore request (nil: nothing known).
	checkpoint *messages.CheckpointAt
}

type sourceResult struct {
	outcome Outcome
	err     error
	decided <-chan commitShown
}

// commitShown is what a read of the record after the cutover says of the
// move's commit: known is false when the run ended without a read that
// decides it.
type commitShown struct {
	known bool
	at    time.Time
	err   error // nil: the target committed
}

// showsCommit judges a record read after the cutover for Relocate's
// answer (handoff.CommitShown).
func showsCommit(o Outcome, self string, v location.Versioned) (bool, error) {
	return handoff.CommitShown(o.RelocationID, o.Key, o.To, self, recordView(v))
}

// Relocate moves the Actor or Instance Spot key, owned by this node, to the
// node targetRid, with roam's hand-off (docs/PROTOCOL.md §5). It returns once the target's
// commit is visible in the Location Store, or the move failed (NotFound
// at once if no node of this mesh is targetRid).
func (d *Driver) Relocate(ctx context.Context, key location.AuthorityKey, targetRid string) (Outcome, error) {
	return d.relocate(ctx, key, targetRid, moveSpec{})
}

// RelocateIfIdle is Relocate for a move that only an idle object admits
// (docs/PLACEMENT.md §3): at its seal — between two turns, on the object's
// own goroutine — every participant must have no message queued and no
// timer due within window; otherwise the seal is undone at once, nothing
// leaves the node and the error is ErrUnavailable with ErrBusy. A busy
// object seen before the move starts is refused the same way with no
// message to the target. Messages that arrive while the idle object is
// sealed take the normal hold and follow path.
func (d *Driver) RelocateIfIdle(ctx context.Context, key location.AuthorityKey, targetRid string, window time.Duration) (Outcome, error) {
	return d.relocate(ctx, key, targetRid, moveSpec{idleOnly: true, idleWindow: window})
}

// moveSpec is what a move asks beyond its object and target: join, when
// set, names the User Spot incarnation the Actor joins at the target's
// commit (JoinSpot); idleOnly admits the move only at an idle seal
// (RelocateIfIdle), with no timer due within idleWindow.
type moveSpec struct {
	join       *messages.Membership
	idleOnly   bool
	idleWindow time.Duration
}

// relocate is Relocate with spec.
func (d *Driver) relocate(ctx context.Context, key location.AuthorityKey, targetRid string, spec moveSpec) (Outcome, error) {
	if err := d.servingWithin(ctx); err != nil {
		return Outcome{}, err
	}
	addr, err := d.moveTarget(ctx, targetRid)
	if err != nil {
		return Outcome{}, err
	}
	members := -1
	if key.Kind == location.KindUserSpot {
		// A SpotWide Spot moves with its members: as many as its record
		// counts must be here (PROTOCOL.md §5.15).
		v, err := d.store.Read(ctx, key)
		if err != nil && !errors.Is(err, location.ErrNotFound) {
			return Outcome{}, roamerr.Keep(roamerr.ErrUnavailable, "read "+key.String(), err)
		}
		members = int(v.Record.GetMemberCount())
	}
	var waiter chan sourceResult
	for {
		waiter, err = call(ctx, d, func() (chan sourceResult, error) { return d.startSource(ctx, key, targetRid, addr, spec, members) })
		var settling *settlingError
		if !errors.As(err, &settling) {
			break
		}
		if err := settling.opening.refuseReentry(key); err != nil {
			return Outcome{}, err
		}
		select {
		case <-settling.done: // start again
		case <-ctx.Done():
			return Outcome{}, fmt.Errorf("%w: %s is settling (a cold activation whose recovery pointer is not removed yet, or a SpotWide arrival whose members' queues are not open yet): %w", roamerr.ErrDeadlineExceeded, key, ctx.Err())
		case <-d.node.Stopped():
			return Outcome{}, d.stoppedMoving(key)
		}
	}
	if err != nil {
		return Outcome{}, err
	}
	var res sourceResult
	select {
	case res = <-waiter:
	case <-ctx.Done():
		// Only this waiter ends; the move keeps its phase rules (PROTOCOL.md §6.6).
		return Outcome{}, fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	case <-d.node.Stopped():
		// The move's timers went with the node (closeTimers): nothing
		// would complete it, so a caller without a deadline would wait
		// for ever.
		return Outcome{}, d.stoppedMoving(key)
	}
	if res.err != nil {
		return res.outcome, res.err
	}
	until := res.outcome.Requested.Add(d.cfg.RestoreTimeout)
	if d.inProcess {
		// A watch of an in-process store costs nothing and wakes at the
		// commit itself, sooner than the move's own confirmation read
		// reaches this goroutine.
		return d.awaitCommit(ctx, res.outcome, until)
	}
	patienceC, patience := machine.NewTimer(d.clock, machine.Until(d.clock, d.cfg.Handoff.CommitPatience(until, d.cfg.RestoreTimeout)))
	defer patience.Stop()
	var shown commitShown
	got := false
	stopped := false
	select {
	case shown = <-res.decided:
		got = true
	case <-patienceC:
	case <-ctx.Done():
	case <-d.node.Stopped():
		stopped = true
	}
	if !got {
		select { // a decisive read that came with the deadline still counts
		case shown = <-res.decided:
			got = true
		default:
		}
	}
	switch {
	case got && shown.known:
		o := res.outcome
		if shown.err != nil {
			return o, shown.err
		}
		o.Committed = shown.at
		o.Pause = o.Committed.Sub(o.Sealed)
		return o, nil
	case stopped:
		return res.outcome, d.stoppedMoving(key)
	case got: // the run ended with no read that decided it
		return d.awaitCommit(ctx, res.outcome, later(until, d.clock.Now()))
	case ctx.Err() != nil:
		return res.outcome, fmt.Errorf("%w: commit of relocation %d not confirmed: %w", roamerr.ErrDeadlineExceeded, res.outcome.RelocationID, ctx.Err())
	}
	return res.outcome, fmt.Errorf("%w: commit of relocation %d not confirmed: no read of the record decided it", roamerr.ErrUnavailable, res.outcome.RelocationID)
}

// stoppedMoving is Relocate's answer when this node stopped while it
// waited for its move of key: the target may still commit it, so the
// outcome is not known here.
func (d *Driver) stoppedMoving(key location.AuthorityKey) error {
	return fmt.Errorf("%w: node %s stopped before its move of %s ended; whether the target committed it is not known here", roamerr.ErrUnavailable, d.desc.GetNodeRid(), key)
}

// settlingError: the object cannot move before its cold activation's
// recovery pointer is gone, or before the members a SpotWide Spot brought
// have their queues open; done is closed then.
// opening is set when it is a SpotWide arrival's (a move of the Spot made
// from inside its RelocationReady callback is refused, not waited for).
type settlingError struct {
	done    <-chan struct{}
	opening *memberOpening
}

func (e *settlingError) Error() string {
	return "relocation: the object is settling (a cold activation, or a SpotWide arrival)"
}

// awaitCommit watches the store until the record names the target with
// this move's RelocationId, or the restore deadline passes (the target
// stops trying then, PROTOCOL.md §5.11).
func (d *Driver) awaitCommit(ctx context.Context, o Outcome, deadline time.Time) (Outcome, error) {
	wctx, cancel := machine.WithDeadline(ctx, d.clock, d.cfg.Handoff.CommitPatience(deadline, d.cfg.RestoreTimeout))
	defer cancel()
	var after location.StoreVersion
	for {
		v, err := d.store.Watch(wctx, o.Key, after)
		if err != nil {
			return o, roamerr.Keep(roamerr.ErrUnavailable, fmt.Sprintf("commit of relocation %d not confirmed", o.RelocationID), err)
		}
		if done, err := showsCommit(o, d.desc.GetNodeRid(), v); done {
			if err == nil {
				o.Committed = d.clock.Now()
				o.Pause = o.Committed.Sub(o.Sealed)
			}
			return o, err
		}
		after = v.Version
	}
}

func (d *Driver) startSource(ctx context.Context, key location.AuthorityKey, targetRid, addr string, spec moveSpec, members int) (chan sourceResult, error) {
	if err := ctx.Err(); err != nil {
		// The caller gave up before the driver got here (or came with a
		// deadline already past): nothing starts that it could not wait for.
		return nil, fmt.Errorf("%w: relocation of %s not started: %w", roamerr.ErrDeadlineExceeded, key, err)
	}
	obj := d.objects[key]
	if obj == nil {
		if t := d.arriving(key); t != nil {
			// The object is arriving here (committed or about to be): start
			// once the arrival has opened or failed.
			w := make(chan sourceResult, 1)
			t.onDone = append(t.onDone, func() { d.startWhenSettled(ctx, key, targetRid, addr, spec, members, w) })
			return w, nil
		}
	}
	// The lease again, on the driver goroutine: a start that waited for an
	// arrival may come after the lifecycle ended.
	facts := handoff.StartFacts{Lease: d.serving(), Owned: obj != nil, TargetIsSelf: targetRid == d.desc.GetNodeRid()}
	if obj != nil {
		facts.Serving, facts.Moving, facts.Changing = obj.state == serving, obj.r().out != nil, obj.r().changing > 0
		if spot := d.spotWideOf(obj); spot != nil {
			facts.SpotWideSpot = spot.key.ID
		}
	}
	if err := handoff.RefuseStart(facts, key, targetRid); err != nil {
		return nil, err
	}
	switch {
	case obj.flags.load(flagActivating):
		// The record still carries the cold activation's recovery pointer,
		// which only this incarnation removes (after its first message).
		return nil, &settlingError{done: obj.settled()}
	}
	if isDisabled(obj.kind.Policy) {
		return nil, fmt.Errorf("%w: kind %q has DisableRelocation", roamerr.ErrInvalidOperation, obj.kind.StableType)
	}
	var memberObjs []*object
	if key.Kind == location.KindUserSpot && obj.kind.SpotWide {
		var err error
		if memberObjs, err = d.spotWideMembers(obj, members); err != nil {
			return nil, err
		}
	}
	if spec.idleOnly {
		// A first look, before anything is asked of the target or a Session
		// owner; the seal decides (busyAtSeal).
		for _, o := range append([]*object{obj}, memberObjs...) {
			if n := o.mb.UserMessageCount(); n > 0 {
				return nil, handoff.BusyError(o.key, fmt.Sprintf("%d messages queued", n))
			}
		}
	}
	now := d.clock.Now()
	// Each attempt offers a new owner generation, never one an earlier
	// attempt of this incarnation offered: the target incarnation's PID is
	// named by it (objectPIDName), and a target removed by a failed or
	// fenced-out attempt keeps that name for one Message Follow period, so
	// a retry to the same node offering the same generation could not
	// spawn there. The name cannot carry the RelocationId instead: callers
	// derive the PID from the owner record, whose RelocationId a later
	// fence-out changes while the incarnation stays. Owner generations
	// only order owners; a skipped one is never written.
	newOwner := max(obj.ownerGeneration, obj.r().offeredOwner) + 1
	obj.x().offeredOwner = newOwner
	id := handoff.Identity{
		RelocationID:            newRelocationID(),
		TargetAttemptGeneration: 1,
		Fence:                   handoff.Fence{NodeRid: d.desc.GetNodeRid(), NodeGeneration: d.desc.GetNodeGeneration(), OwnerGeneration: obj.ownerGeneration},
	}
	r := &sourceRun{
		m:         handoff.NewSource(id, d.cfg.Handoff, now.Add(d.cfg.RestoreTimeout)),
		obj:       obj,
		parts:     []*sourcePart{{obj: obj, newOwner: newOwner}},
		target:    &messages.NodeRef{NodeRid: targetRid, Address: addr},
		targetPID: PID(addr),
		join:      spec.join,
		idleOnly:  spec.idleOnly,
		idleFor:   spec.idleWindow,
		waiter:    make(chan sourceResult, 1),
		decided:   make(chan commitShown, 1),
		deadline:  now.Add(d.cfg.RestoreTimeout),
		outcome:   Outcome{RelocationID: id.RelocationID, Key: key, From: d.desc.GetNodeRid(), To: targetRid, Requested: now},
	}
	for _, m := range memberObjs {
		owner := max(m.ownerGeneration, m.r().offeredOwner) + 1
		m.x().offeredOwner = owner
		r.parts = append(r.parts, &sourcePart{obj: m, newOwner: owner})
	}
	for _, p := range r.parts {
		p.next = actor.NewPID(addr, objectPIDName(p.obj.key, p.obj.generation, p.newOwner))
		p.nextRid = targetRid
		p.obj.x().out = r
	}
	parts := make([]*sourcerun.Part[any], len(r.parts))
	for i, p := range r.parts {
		parts[i] = &p.Part
	}
	r.run = sourcerun.New[any, location.Versioned](r.m, sourceEnv{d: d, r: r}, parts)
	d.sources[id.RelocationID] = r
	d.stepSource(r, handoff.Start{SessionBound: r.sessionBound(), Participants: len(r.parts)})
	return r.waiter, nil
}

// startWhenSettled starts a move that waited for the object's arrival
// here, on the driver goroutine, and hands its result to w; an object
// still settling (its cold activation, or the members a SpotWide Spot
// brought whose queues are not open yet) is started once it has.
func (d *Driver) startWhenSettled(ctx context.Context, key location.AuthorityKey, targetRid, addr string, spec moveSpec, members int, w chan sourceResult) {
	if ctx.Err() != nil {
		w <- sourceResult{err: fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, ctx.Err())}
		return // the caller gave up: start nothing for it
	}
	inner, err := d.startSource(ctx, key, targetRid, addr, spec, members)
	var settling *settlingError
	switch {
	case errors.As(err, &settling):
		machine.Go(func() {
			select {
			case <-settling.done:
				d.loop.Post(func() { d.startWhenSettled(ctx, key, targetRid, addr, spec, members, w) })
			case <-ctx.Done():
				w <- sourceResult{err: fmt.Errorf("%w: %s is settling: %w", roamerr.ErrDeadlineExceeded, key, ctx.Err())}
			case <-d.node.Stopped(): // Relocate's own wait ends on the stop too
			}
		})
	case err != nil:
		w <- sourceResult{err: err}
	default:
		machine.Go(func() {
			select {
			case r := <-inner:
				w <- r
			case <-d.node.Stopped(): // a stopped driver completes no move
			}
		})
	}
}

// stepSource feeds ev to r's interpreter (sourcerun.Run.Step).
func (d *Driver) stepSource(r *sourceRun, ev handoff.Event) { r.run.Step(ev) }

// endSource settles a move that is over: its budget, its unused ticket,
// Relocate's wait and the objects' claim on it.
func (d *Driver) endSource(r *sourceRun) {
	d.budgetOut(d.budget.End(r.m.Identity().RelocationID))
	if r.ticket != nil && !r.prepareSent {
		// Given and never used (the move ended before its seal): the
		// target need not keep it (tickets_out.go).
		d.giveBack(r.target.GetAddress(), [][]byte{r.ticket})
	}
	r.show(commitShown{}) // no read decided it: Relocate watches the record itself
	for _, p := range r.parts {
		if p.obj.r().out == r {
			p.obj.x().out = nil
		}
	}
}

// later feeds ev to the run of id on the driver goroutine, if it still runs.
func (d *Driver) later(id uint64, ev handoff.Event) {
	d.loop.Post(func() {
		if r := d.sources[id]; r != nil {
			d.stepSource(r, ev)
		}
	})
}

// The source's questions to the store while its move's outcome is
// unknown (PROTOCOL.md §6.4, §6.5; docs/FAULTS.md, the fence-out): the
// machine decides (handoff.Source.judge), the driver only reads, watches
// and writes.

// reconcileRead reads the record once.
func (d *Driver) reconcileRead(r *sourceRun, id handoff.Identity) {
	ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.Handoff.CutoverWaitTimeout)
	defer cancel()
	v, err := d.store.Read(ctx, r.obj.key)
	d.answerRead(r, id, v, err)
}

// confirmWatch watches the record until its version is past after or
// until passes (after 0: a read).
func (d *Driver) confirmWatch(r *sourceRun, id handoff.Identity, after uint64, until time.Time) {
	if after == 0 {
		d.reconcileRead(r, id)
		return
	}
	ctx, cancel := machine.WithDeadline(context.Background(), d.clock, until)
	defer cancel()
	machine.Go(func() {
		select {
		case <-d.node.Stopped():
			cancel()
		case <-ctx.Done():
		}
	})
	v, err := d.store.Watch(ctx, r.obj.key, location.StoreVersion(after))
	d.answerRead(r, id, v, err)
}

// answerRead feeds a read to the move on the driver goroutine, keeping the
// record for a FenceOut of that version.
func (d *Driver) answerRead(r *sourceRun, id handoff.Identity, v location.Versioned, err error) {
	if errors.Is(err, location.ErrNotFound) {
		v, err = location.Versioned{}, nil // no record: judged as not at the fence
	}
	ev := handoff.ReconcileRead{Record: recordView(v), Target: r.target.GetNodeRid(), ObjectGeneration: r.obj.generation, Err: err,
		SourceEnded: d.node.LeaseStatus() == lease.Ended}
	d.loop.Post(func() {
		if cur := d.sources[id.RelocationID]; cur == r {
			if err == nil {
				// Before the step, which may end the run: a read that
				// decides the move is Relocate's answer too.
				if done, err := showsCommit(r.outcome, d.desc.GetNodeRid(), v); done {
					r.show(commitShown{known: true, at: d.clock.Now(), err: err})
				}
			}
			r.run.Read(ev, v)
		}
	})
}

// fenceOut writes the move's RelocationId into the record read at version,
// owner unchanged: any CAS of the target still in flight or delayed then
// fails on the version, and a target that reads the record finds its move
// fenced out (handoff.Identity.JudgeCommit). The source never changes the
// owner (PROTOCOL.md §6.5, §11; docs/FAULTS.md).
func (d *Driver) fenceOut(r *sourceRun, id handoff.Identity, read location.Versioned, version uint64) {
	var err error
	if !read.Present() || uint64(read.Version) != version {
		err = fmt.Errorf("%w: no record read at version %d", location.ErrConflict, version)
	} else {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.Handoff.CutoverWaitTimeout)
		defer cancel()
		next := proto.Clone(read.Record).(*location.Record)
		next.RelocationId = id.RelocationID
		_, err = d.store.CompareAndSet(ctx, r.obj.key, read.Version, next)
	}
	d.later(id.RelocationID, handoff.FenceOutAnswered{Err: err})
}

// recordView is what the hand-off machines judge of a record.
func recordView(v location.Versioned) handoff.RecordView { return handoff.ViewOf(v) }

// closeOut tells the application its source incarnation closed by moving
// out (PROTOCOL.md §5.13: OnClosing(RelocationOut)), once the move is confirmed.
// The application's instance is then dropped: the incarnation only
// forwards for MessageFollowDuration, which must not keep a large state
// alive.
func (d *Driver) closeOut(obj *object) {
	// The target's commit freed the slot obj held here (PROTOCOL.md §7.12).
	d.slots.SlotFreedElsewhere()
	_ = obj.mb.Do(func() {
		if c, ok := obj.inst.(Closing); ok {
			c.OnClosing(RelocationOut)
		}
		obj.inst = nil
	})
}

// send delivers a control message to a peer's relocation actor with this
// driver as sender, which the peer checks against the move's source.
func (d *Driver) send(to *actor.PID, msg proto.Message) {
	d.sys.Root.RequestWithCustomSender(to, msg, d.self)
}

// budgetOut sends the chunks the budget lets go and steps the moves it
// admits (any that ended meanwhile are gone from d.sources).
func (d *Driver) budgetOut(out budget.Out) {
	for _, q := range out.Chunks {
		if r := d.sources[q.Run]; r != nil {
			d.sendChunk(r, q.Chunk)
		}
	}
	for _, id := range out.Admitted {
		if r := d.sources[id]; r != nil {
			d.stepSource(r, handoff.Admitted{})
		}
	}
}

func (d *Driver) onCredit(c actor.Context, m *messages.RelocationStateCredit) {
	id := handoff.IdentityFromProto(m.GetIdentity())
	if r := d.sources[id.RelocationID]; r == nil || r.m.Identity() != id {
		return
	}
	d.budgetOut(d.budget.Credit(id.RelocationID, m.GetReceivedBytes()))
}

// onSourceEvent routes a target's reply to the source run of its identity,
// only if it came from that run's target node.
func (d *Driver) onSourceEvent(pid *messages.RelocationIdentity, c actor.Context, ev handoff.Event, before ...func(*sourceRun)) {
	id := handoff.IdentityFromProto(pid)
	r := d.sources[id.RelocationID]
	if r == nil {
		return
	}
	switch handoff.Attribute(r.m.Identity(), r.target.GetAddress(), id, c.Sender().GetAddress()) {
	case handoff.OtherRun:
		return
	case handoff.WrongPeer:
		d.log.Warn().Str("event", "reply_from_wrong_peer").Uint64("relocation_id", id.RelocationID).Msg("reply ignored: not from the move's target")
		return
	}
	for _, f := range before {
		f(r)
	}
	d.stepSource(r, ev)
}

func (d *Driver) onEndpointTerminated(address string) {
	d.forgetSpares(address)
	d.connectionLost(address)
}

// capturedPart is one participant's share of the payload, captured on
// its own goroutine.
type capturedPart struct {
	states []envelope.ApplicationState
	saved  []envelope.SavedWork
	timers []envelope.TimerRegistration
	ticks  []envelope.PendingTimerTick
	// checkpoint: what the participant knew of its stored checkpoint.
	checkpoint *messages.CheckpointAt
}

// safeCapture turns a panicking state adapter into a capture error, so the
// move unseals instead of leaving the object sealed.
func safeCapture(obj *object, saved []any, participant uint32) (c capturedPart, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: capture panicked: %v", roamerr.ErrInvalidOperation, p)
		}
	}()
	return capture(obj, saved, participant)
}

// capture takes a sealed participant's share of the payload, on its own
// goroutine: state through the kind's adapter, timers, and the saved-work
// prefix as frozen records (PROTOCOL.md §5.5, §5.6).
func capture(obj *object, saved []any, participant uint32) (capturedPart, error) {
	c := capturedPart{checkpoint: obj.checkpointAt()}
	if p, ok := obj.kind.Policy.(preserveStateWith); ok {
		state, err := obj.captureState(p)
		if err != nil {
			return c, fmt.Errorf("state adapter of %s: %w", obj.key, err)
		}
		c.states = []envelope.ApplicationState{{ParticipantID: participant, State: state}}
	}
	if obj.tm != nil {
		c.timers = obj.tm.capture()
		for i := range c.timers {
			c.timers[i].ParticipantID = participant
		}
	}
	// Saved work and pending ticks share one order, so the target puts
	// them back interleaved as they were queued.
	for i, msg := range saved {
		if tick, ok := msg.(*messages.TimerTick); ok {
			t := pendingTick(uint64(i+1), tick)
			t.ParticipantID = participant
			c.ticks = append(c.ticks, t)
			continue
		}
		rec, err := toRecord(msg)
		if err != nil {
			return c, err
		}
		c.saved = append(c.saved, envelope.SavedWork{ParticipantID: participant, Order: uint64(i + 1), Record: rec})
	}
	return c, nil
}

// encodePayload builds the move's one relocation-envelope-v1 stream from
// its participants' captures, in participant order.
func (d *Driver) encodePayload(r *sourceRun) (envelope.Stream, error) {
	id, obj := r.m.Identity(), r.obj
	env := envelope.Envelope{
		Relocation: envelope.Relocation{
			RelocationID: id.RelocationID, TargetAttemptGeneration: id.TargetAttemptGeneration,
			CoordinatorFence: envelope.Fence{NodeRid: id.Fence.NodeRid, NodeGeneration: id.Fence.NodeGeneration, OwnerGeneration: id.Fence.OwnerGeneration},
		},
		Object:             envelope.Object{Kind: uint8(obj.key.Kind), ID: obj.key.ID, ObjectGeneration: obj.generation, StableType: obj.kind.StableType},
		ApplicationVersion: obj.kind.ApplicationVersion,
	}
	for _, c := range r.captures {
		env.ApplicationStates = append(env.ApplicationStates, c.states...)
		env.SavedWork = append(env.SavedWork, c.saved...)
		env.TimerRegistrations = append(env.TimerRegistrations, c.timers...)
		env.PendingTimerTicks = append(env.PendingTimerTicks, c.ticks...)
	}
	// The states are not copied into the stream: its chunks slice them
	// (the adapters handed them over).
	stream, err := envelope.EncodeStream(&env)
	if err != nil {
		return envelope.Stream{}, errors.Join(roamerr.ErrInvalidOperation, err)
	}
	return stream, nil
}

// members are the participants after the first, for the Restore request.
func (r *sourceRun) members() []*messages.Participant {
	if len(r.parts) < 2 {
		return nil
	}
	out := make([]*messages.Participant, 0, len(r.parts)-1)
	for _, p := range r.parts[1:] {
		o := p.obj
		out = append(out, &messages.Participant{
			Object:          &messages.ObjectRef{Kind: o.key.Kind, Id: o.key.ID, ObjectGeneration: o.generation, StableType: o.kind.StableType},
			OwnerGeneration: o.ownerGeneration, NewOwnerGeneration: p.newOwner, ApplicationVersion: o.kind.ApplicationVersion,
			Session: o.r().session, Checkpoint: p.checkpoint,
		})
	}
	return out
}

// show hands Relocate what the store showed of the move's commit; the
// first answer stands.
func (r *sourceRun) show(c commitShown) {
	select {
	case r.decided <- c:
	default:
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// noticePatience is how long the first commit confirmation waits for the
// target's OwnerCommitted before it watches the record.
func (d *Driver) noticePatience() time.Duration { return d.cfg.Handoff.CutoverWaitTimeout / 4 }

// firstConfirm is a move's first commit confirmation after the cutover.
// The target commits right after the cutover and says so
// (OwnerCommitted): one read then confirms it, where watching the record
// would cost a blocking query or repeated reads per move (a drain's rate
// is the store's round trips). Without the notice within
// noticePatience (lost, or a slow commit), it watches past hint, the
// record version the target's relay-ready named: the change the commit
// makes. Either way the store answers, and the machine judges the answer.
func (d *Driver) firstConfirm(r *sourceRun, id handoff.Identity, hint uint64, committed <-chan struct{}, until time.Time) {
	if d.inProcess {
		// A watch costs nothing here and wakes at the commit itself,
		// sooner than the notice's message hop.
		d.confirmWatch(r, id, hint, until)
		return
	}
	fire, t := machine.NewTimer(d.clock, d.noticePatience())
	defer t.Stop()
	select {
	case <-committed:
		d.reconcileRead(r, id)
	case <-fire:
		d.confirmWatch(r, id, hint, until)
	case <-d.node.Stopped():
		d.confirmWatch(r, id, hint, until) // ends with the node
	}
}

// onOwnerCommitted takes a move's target's notice of its commit, from that
// target only.
func (d *Driver) onOwnerCommitted(c actor.Context, m *messages.OwnerCommitted) {
	id := handoff.IdentityFromProto(m.GetIdentity())
	r := d.sources[id.RelocationID]
	if r == nil || r.m.Identity() != id || r.committed == nil {
		return
	}
	if s := c.Sender(); s == nil || s.Address != r.target.GetAddress() {
		return
	}
	close(r.committed)
	r.committed = nil
}

// busyAtSeal is an idle-only move's check at the seal, on the object's
// goroutine between turns (handoff.BusyAtSeal decides).
func busyAtSeal(obj *object, saved []any, idleOnly bool, window time.Duration, now time.Time) error {
	return handoff.BusyAtSeal(obj.key, idleOnly, len(saved), window, func(window time.Duration) (string, bool) {
		if obj.tm == nil {
			return "", false
		}
		return obj.tm.dueWithin(now, window)
	})
}
