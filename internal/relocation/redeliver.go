package relocation

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/redelivery"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// redeliver hands the driver a message that Message Follow does not take
// further (its hop limit, a next hop that left; followSink) or a send that
// dead-lettered: the driver re-resolves the object's owner from the store
// and delivers it there directly, in arrival order per queue.
type redeliver struct {
	key location.AuthorityKey
	// from is the AuthorityOwnerGeneration of the moved-away incarnation
	// whose Message Follow handed the message over (not for a dead
	// letter). Each incarnation has a queue and a worker of its own: a
	// worker waits for what its incarnation forwarded earlier
	// (drainFirst), which may wait in a later incarnation's queue, so one
	// queue per object could wait on itself.
	from uint64
	env  *actor.MessageEnvelope
	// deadLetter: the message was dead-lettered (onDeadLettered), not
	// handed over by Message Follow; only the log line differs.
	deadLetter bool
	// peerDown: Message Follow's next hop, at this address, had its
	// connection ended or said it is leaving (followSink); only the log
	// line differs.
	peerDown string
	// drainFirst, if set, is the next hop this incarnation followed to
	// until now, still connected: the worker sends a RouteBarrier down it
	// and waits for its answer before it delivers this message, so what
	// was forwarded there arrives first (followSink).
	drainFirst *actor.PID
}

// redeliveryQueue names a redelivery queue: an object's dead letters, or
// what one incarnation's Message Follow handed over (from).
type redeliveryQueue struct {
	key        location.AuthorityKey
	from       uint64
	deadLetter bool
}

func (m *redeliver) queue() redeliveryQueue { return redeliveryQueue{m.key, m.from, m.deadLetter} }

// lastDelivery is the incarnation a queue's worker delivered to last, and
// when it ended.
type lastDelivery struct {
	pid *actor.PID
	at  time.Time
}

// onRedeliver queues m behind its queue's earlier redeliveries and starts
// the queue's redelivery worker if none runs. Once the lifecycle has
// ended nothing is redelivered any more: m fails at once.
func (d *Driver) onRedeliver(m *redeliver) {
	if d.Usable() != nil {
		d.abandon(m, d.endReason())
		return
	}
	q, running := d.redeliveries[m.queue()]
	d.redeliveries[m.queue()] = append(q, m)
	if !running {
		if m.deadLetter {
			// At most one line per object per follow period: a stale route
			// used under steady traffic restarts the worker per batch.
			if last, ok := d.deadLetterLogged[m.key]; d.redelivery().LogDue(last, ok, machine.Real.Now()) { // log pacing: real time
				d.deadLetterLogged[m.key] = machine.Real.Now()
				d.log.Info().Str("event", "dead_letter_reresolved").Str("object_id", m.key.ID).
					Msg("sends to an incarnation that is gone are delivered from the store's owner record")
			}
		} else if m.peerDown != "" {
			d.log.Info().Str("event", "follow_reresolved").Str("object_id", m.key.ID).Str("peer", m.peerDown).
				Msg("the connection to Message Follow's next hop ended; delivering from the store's owner record")
		} else {
			d.log.Info().Str("event", "follow_reresolved").Str("object_id", m.key.ID).
				Msg("Message Follow reached its hop limit; delivering from the store's owner record")
		}
		last := d.redelivered[m.queue()]
		delete(d.redelivered, m.queue())
		if !d.redelivery().Drains(last.at, d.clock.Now()) {
			last.pid = nil
		}
		go d.redeliverWorker(m.queue(), last.pid)
	}
}

// redelivery is the node's redelivery policy, on the driver's goroutine.
func (d *Driver) redelivery() redelivery.Policy {
	return redelivery.Policy{
		FollowDuration: d.cfg.Handoff.FollowDuration, Window: d.cfg.RedeliveryWindow, Patience: d.deadLetterPatience,
		Backoff: d.cfg.DeadLetterBackoff, BackoffMax: d.cfg.DeadLetterBackoffMax,
	}
}

// takeRedeliveries pops the queue's messages on the driver's goroutine;
// an empty queue ends the worker (the queue is removed, so the next
// redelivery starts a new one, which learns where this one delivered
// last). So does an ended lifecycle: what is still queued then fails
// loudly here. The worker may have stopped waiting for this call already
// (the node stopped), so nothing it would return may be left to it.
func (d *Driver) takeRedeliveries(queue redeliveryQueue, last *actor.PID) []*redeliver {
	out, _ := call(context.Background(), d, func() ([]*redeliver, error) {
		q := d.redeliveries[queue]
		if len(q) == 0 || d.Usable() != nil {
			delete(d.redeliveries, queue)
			for _, m := range q {
				d.abandon(m, d.endReason())
			}
			if last != nil && d.Usable() == nil {
				now, p := d.clock.Now(), d.redelivery()
				if !p.Drains(d.redeliveredSwept, now) {
					for k, l := range d.redelivered {
						if !p.Drains(l.at, now) {
							delete(d.redelivered, k)
						}
					}
					d.redeliveredSwept = now
				}
				d.redelivered[queue] = lastDelivery{pid: last, at: now}
			}
			return nil, nil
		}
		d.redeliveries[queue] = q[:0:0]
		return q, nil
	})
	return out
}

// redeliverWorker delivers a queue's messages to the owner the store
// names, batch by batch, in order, with a fresh hop budget. If the object
// is gone, or no owner is reachable within Config.RedeliveryWindow, each message
// fails loudly: a request with a typed DeliveryFailed, a send logged and
// counted. So does a batch whose lifecycle ended while it looked the
// owner up.
//
// A message that leaves its route here must not overtake one that went
// on before it. So the worker first drains the hop its incarnation
// followed to (drainFirst), and before it delivers to another incarnation
// than the one it delivered to last (the object moved on meanwhile), it
// drains that one: what it sent there may still be following.
func (d *Driver) redeliverWorker(queue redeliveryQueue, last *actor.PID) {
	key := queue.key
	for {
		batch := d.takeRedeliveries(queue, last)
		if len(batch) == 0 {
			return
		}
		for _, m := range batch {
			if m.drainFirst != nil {
				d.drainHop(m.drainFirst)
			}
		}
		pid, err := d.resolveWithin(key, d.cfg.RedeliveryWindow)
		if err == nil && last != nil && !last.Equal(pid) {
			d.drainHop(last)
		}
		outcome := redelivery.Batch(d.Usable() != nil, err)
		for _, m := range batch {
			switch outcome {
			case redelivery.Abandon:
				d.abandon(m, d.endReason())
			case redelivery.FailNoOwner:
				d.failRedelivery(key, m.env, "no owner to deliver to", err)
			default:
				env := m.env
				out := &actor.MessageEnvelope{Header: maps.Clone(env.Header), Message: env.Message, Sender: env.Sender}
				out.SetHeader(HeaderHops, "0") // a direct delivery; the generation header stays
				d.sys.Root.Send(pid, out)
				last = pid
			}
		}
	}
}

// drainHop sends a RouteBarrier down a Message Follow hop and waits until
// it is answered (everything sent there before it has reached the owner),
// failed, the hop's connection ended (what it held is gone with it), or
// the follow period passed (an old incarnation answers Unavailable by
// then).
func (d *Driver) drainHop(hop *actor.PID) {
	d.draining.Add(1)
	defer d.draining.Add(-1)
	// On a worker's goroutine: only the fixed configuration is read here
	// (the patience is the driver goroutine's).
	window := redelivery.Policy{FollowDuration: d.cfg.Handoff.FollowDuration, Window: d.cfg.RedeliveryWindow}.DrainWindow()
	answered := make(chan struct{})
	go func() {
		// Answered where the route ends, on any node.
		ctx, cancel := d.untilStopped()
		defer cancel()
		_, _ = ask.Ask(ctx, d.sys, hop, &messages.RouteBarrier{}, window, ask.Question{Clock: d.clock, What: "route barrier",
			Accept: func(msg any) bool { _, ok := msg.(*messages.RouteBarrier); return ok }})
		close(answered)
	}()
	// Nor past the hop's connection or this node's lifecycle: nothing
	// answers then.
	ended, forget := d.peers.whenEnded(hop.Address)
	defer forget()
	select {
	case <-answered:
	case <-ended:
	case <-d.node.LeaseLost():
	}
}

// resolveWithin resolves key's current owner, retrying while the store or
// the owner's node is unavailable, for at most window.
func (d *Driver) resolveWithin(key location.AuthorityKey, window time.Duration) (*actor.PID, error) {
	ctx, cancel := machine.WithTimeout(context.Background(), d.clock, window)
	defer cancel()
	for wait := time.Duration(0); ; {
		pid, err := d.lookup(ctx, key)
		again, after := redelivery.ResolveAgain(err, wait)
		if !again {
			return pid, err
		}
		wait = after
		select {
		case <-ctx.Done():
			return nil, err
		case <-machine.After(machine.Real, wait): // pacing
		}
	}
}

// lookup is the incarnation a redelivery goes to: the owner record and
// its node's address as redelivery.Lookup finds them, the rule the Spot
// simulation runs too. (Driver.Resolve reads the same.)
func (d *Driver) lookup(ctx context.Context, key location.AuthorityKey) (pid *actor.PID, err error) {
	redelivery.Lookup(lookupEnv{d, ctx}, key, func(v location.Versioned, addr string, e error) {
		if err = e; e == nil {
			pid = actor.NewPID(addr, objectPIDName(key, v.Record.GetObjectGeneration(), v.Record.GetAuthorityOwnerGeneration()))
		}
	})
	return pid, err
}

// lookupEnv is redelivery.Lookup's host on the driver: each primitive
// blocks and calls back before it returns.
type lookupEnv struct {
	d   *Driver
	ctx context.Context
}

func (e lookupEnv) Self() *location.NodeDescriptor { return e.d.desc }

func (e lookupEnv) Read(key location.AuthorityKey, done func(location.Versioned, error)) {
	done(e.d.store.Read(e.ctx, key))
}

func (e lookupEnv) ReadNode(key location.NodeKey, done func(location.VersionedNode, error)) {
	done(e.d.store.ReadNode(e.ctx, key))
}

func (d *Driver) failRedelivery(key location.AuthorityKey, env *actor.MessageEnvelope, reason string, err error) {
	if env.Sender != nil {
		RespondFailure(d.sys, env.Sender, env.Message, key.ID, err)
		return
	}
	d.metrics.sendUndelivered("send_redelivery_failed")
	d.log.Warn().Str("event", "send_redelivery_failed").Str("object_id", key.ID).Str("message_type", typeName(env.Message)).
		Str("reason", reason).Err(err).Msg("a send past the Message Follow hop limit was not redelivered")
	respondFailure(d.sys, noticeOf(env), nil, roamerr.Code(err), key.ID, err.Error())
}

// The reasons a redelivery ends undelivered when the lifecycle ends.
const (
	reasonNodeStopped = "node stopped"
	reasonLeaseEnded  = "owner lease ended"
)

// endReason says why the lifecycle ended: the node stopped, or its owner
// lease ended while it ran.
func (d *Driver) endReason() string {
	if isClosed(d.node.Stopping()) {
		return reasonNodeStopped
	}
	return reasonLeaseEnded
}

// abandon fails loudly a redelivery that will not be made because the
// lifecycle ended (why: endReason): a dead-lettered send as send_dead_letter,
// a message past the hop limit as send_redelivery_failed (a request gets
// Unavailable).
func (d *Driver) abandon(m *redeliver, why string) {
	if m.deadLetter {
		d.failDeadLetter(m.key, m.env.Message, why, "the send was waiting for its redelivery when the node's lifecycle ended")
		return
	}
	d.failRedelivery(m.key, m.env, why, fmt.Errorf("%w: %s before the message could be redelivered", roamerr.ErrUnavailable, why))
}

// abandonRedeliveries runs when the lifecycle ends (the node stops, or
// its owner lease ended): every redelivery still waiting — queued for its
// worker, or held for a back-off — fails loudly now. Otherwise they would
// vanish: a worker's call to the driver fails once the node stopped, and a
// held send's retry would find no worker to take it.
func (d *Driver) abandonRedeliveries() {
	why := d.endReason()
	for key, h := range d.deadLetterHeld {
		for _, env := range h.msgs {
			d.failDeadLetter(key, env.Message, why, "the send was waiting for its redelivery when the node's lifecycle ended")
		}
		delete(d.deadLetterHeld, key)
	}
	for queue, q := range d.redeliveries {
		for _, m := range q {
			d.abandon(m, why)
		}
		delete(d.redeliveries, queue) // a running worker finds nothing and ends
	}
}

// A one-way send to an incarnation's PID that Proto.Actor could not
// deliver — the PID's node has left and its connection is down, or the
// incarnation no longer exists there (its follow period ended) — becomes a
// dead letter, which Proto.Actor only logs. A send that the caller saw
// accepted must not vanish: the driver of the node where it dead-lettered
// re-resolves the object from the store and delivers it there, like a
// message past the follow hop limit. Requests are not taken: their caller
// gets a DeadLetterResponse and retries on a fresh route.
//
// Proto.Actor's dead-letter event carries the message without its
// headers, so the redelivery is a plain send to the current incarnation.
// Its order relative to the sender's later sends, which already take a
// fresh route, is not kept.

// deadLettered is a dead-lettered send to an object's incarnation.
type deadLettered struct {
	key location.AuthorityKey
	msg any
	// generation is the ObjectGeneration an Actor's PID named: the
	// redelivered send carries it, so an Actor spawned again after a
	// delete refuses it (PROTOCOL.md §2.3) rather than taking what was sent
	// to the old one. (An Instance Spot reactivated after its owner ended
	// takes the sends to its old PIDs: "".)
	generation string
}

// onDeadLetterEvent runs on the publisher's goroutine: it only picks the
// sends to incarnation PIDs and hands them to the driver.
func (d *Driver) onDeadLetterEvent(e *actor.DeadLetterEvent) {
	if e.Sender != nil || e.PID == nil || e.Message == nil {
		return
	}
	switch m := e.Message.(type) {
	case actor.SystemMessage, *messages.TimerTick:
		return // not a caller's send: a tick belongs to the incarnation that armed it
	case *messages.SpotActivation:
		d.onActivationDeadLetter(m)
		return
	case proto.Message:
	default:
		return // only a protobuf message can be delivered to another node
	}
	key, ok := keyOfObjectPID(e.PID.Id)
	if !ok {
		return
	}
	if isClosed(d.node.Stopped()) {
		d.failDeadLetter(key, e.Message, reasonNodeStopped, "the node stopped before the send could be redelivered")
		return
	}
	dl := &deadLettered{key: key, msg: e.Message}
	if key.Kind == location.KindActor {
		dl.generation = generationOfObjectPID(e.PID.Id)
	}
	d.sys.Root.Send(d.self, dl)
}

// onDeadLettered redelivers a dead-lettered send through the store, at
// once or after a pause, or fails it loudly, as the redelivery policy
// decides (redelivery.Policy.DeadLettered).
func (d *Driver) onDeadLettered(m *deadLettered) {
	now, p := d.clock.Now(), d.redelivery()
	if p.SweepDue(d.deadLetterSwept, now) {
		for k, s := range d.deadLetters {
			if p.Forgotten(s.First, now) {
				delete(d.deadLetters, k)
			}
		}
		for k, at := range d.deadLetterLogged {
			if p.LogDue(at, true, now) {
				delete(d.deadLetterLogged, k)
			}
		}
		d.deadLetterSwept = now
	}
	if d.Usable() != nil {
		d.failDeadLetter(m.key, m.msg, d.endReason(), "the node's lifecycle ended before the send could be redelivered")
		return
	}
	// Which send is this? Only a copy this driver redelivered names an
	// earlier dead letter (its own send); any other message is a send
	// dead-lettered for the first time, even a message value seen before:
	// an application may send one value (one pointer) many times, and
	// each send has its own count and patience.
	tracked := reflect.TypeOf(m.msg).Comparable()
	s := &redelivery.Send{First: now}
	if tracked {
		if seen := d.deadLetters[m.msg]; seen != nil {
			s = seen
			delete(d.deadLetters, m.msg)
		}
	}
	s.N++
	held := d.deadLetterHeld[m.key]
	decision := p.DeadLettered(*s, now, held != nil, held != nil && held.timer)
	if decision.Verdict == redelivery.Fail {
		d.failDeadLetter(m.key, m.msg, "redelivery patience exhausted", "no incarnation took the send within the redelivery patience")
		return
	}
	// Every attempt carries a fresh copy that only this driver holds, so
	// that its dead letter, if it comes back, is known as this send's.
	msg := m.msg
	if pm, ok := msg.(proto.Message); ok && tracked {
		msg = proto.Clone(pm)
		d.deadLetters[msg] = s
	}
	env := &actor.MessageEnvelope{Message: msg}
	if m.generation != "" {
		env.SetHeader(HeaderGeneration, m.generation)
	}
	if decision.Verdict == redelivery.Now {
		d.onRedeliver(&redeliver{key: m.key, env: env, deadLetter: true}) // in arrival order
		return
	}
	if held == nil {
		held = &deadLetterHold{}
		d.deadLetterHeld[m.key] = held
	}
	held.msgs = append(held.msgs, env)
	if decision.Arm {
		held.timer = true
		d.startTimer(timerKey{deadLetter: m.key}, handoff.StartTimer{After: decision.After})
	}
}

// releaseDeadLetters redelivers key's held dead letters, in order, once
// their pause is over.
func (d *Driver) releaseDeadLetters(key location.AuthorityKey) {
	h := d.deadLetterHeld[key]
	if h == nil {
		return // failed when the lifecycle ended (abandonRedeliveries)
	}
	delete(d.deadLetterHeld, key)
	for _, env := range h.msgs {
		d.onRedeliver(&redeliver{key: key, env: env, deadLetter: true})
	}
}

// deadLetterHold is an object's dead-lettered sends waiting for a retry.
type deadLetterHold struct {
	msgs  []*actor.MessageEnvelope
	timer bool
}

func (d *Driver) failDeadLetter(key location.AuthorityKey, msg any, reason, why string) {
	d.metrics.sendUndelivered("send_dead_letter")
	d.log.Warn().Str("event", "send_dead_letter").Str("object_id", key.ID).Str("message_type", typeName(msg)).
		Str("reason", reason).Msg(why)
}

// onActivationDeadLetter ends a cold activation's envelope (SpotActivation,
// docs/PROTOCOL.md §7.5) that Proto.Actor dead-lettered — its target node
// is gone — loudly: it
// never reached a Spot service, so its first message did not run. A
// request is answered Unavailable at once (its caller may retry); a
// one-way send is logged and counted. Without this only Proto.Actor's own
// dead-letter log saw it.
func (d *Driver) onActivationDeadLetter(a *messages.SpotActivation) {
	const why = "the cold activation's target node is gone; the message was not delivered and did not run"
	// The request's caller, or the send's caller waiting for its dispatch
	// notice, learns it; a send is also logged and counted.
	respondFailure(d.sys, ReplyRoute(a.GetFirst()), a.GetFirst(), roamerr.CodeUnavailable, a.GetSpotId(), why)
	if a.GetFirst().GetSender() != nil {
		return
	}
	d.metrics.sendUndelivered("send_dead_letter")
	d.log.Warn().Str("event", "send_dead_letter").Str("object_kind", "instance_spot").Str("object_id", a.GetSpotId()).
		Str("operation_id", a.GetOperationId()).Str("target_node_rid", a.GetTargetNodeRid()).Str("reason", "activation_target_gone").Msg(why)
}

// generationOfObjectPID is the ObjectGeneration an incarnation PID's name
// (objectPIDName) carries, or "".
func generationOfObjectPID(name string) string {
	at := strings.LastIndexByte(name, '@')
	if at < 0 {
		return ""
	}
	gen, _, ok := strings.Cut(name[at+1:], ".")
	if _, err := strconv.ParseUint(gen, 10, 64); !ok || err != nil {
		return ""
	}
	return gen
}

// keyOfObjectPID parses an incarnation PID's name (objectPIDName).
func keyOfObjectPID(name string) (location.AuthorityKey, bool) {
	rest, ok := strings.CutPrefix(name, "roam/")
	if !ok {
		return location.AuthorityKey{}, false
	}
	kindName, rest, ok := strings.Cut(rest, "/")
	if !ok {
		return location.AuthorityKey{}, false
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return location.AuthorityKey{}, false
	}
	for _, k := range []location.Kind{location.KindActor, location.KindInstanceSpot, location.KindUserSpot} {
		if location.KindName(k) == kindName {
			key := location.Key(k, rest[:at])
			return key, key.Validate() == nil
		}
	}
	return location.AuthorityKey{}, false
}
