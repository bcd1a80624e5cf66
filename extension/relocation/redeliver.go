package relocation

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/roamerr"
)

// redeliver hands the driver a message that Message Follow cannot take
// further (its hop limit): the driver re-resolves the object's owner from
// the store and delivers it there directly, in arrival order per object.
type redeliver struct {
	key location.AuthorityKey
	env *actor.MessageEnvelope
}

// redeliveryWindow bounds how long a message waits for the store to name
// a reachable owner before it fails loudly.
const redeliveryWindow = 10 * time.Second

// onRedeliver queues m behind the object's earlier redeliveries and starts
// the object's redelivery worker if none runs.
func (d *Driver) onRedeliver(m *redeliver) {
	q, running := d.redeliveries[m.key]
	d.redeliveries[m.key] = append(q, m.env)
	if !running {
		d.log.Info().Str("event", "follow_reresolved").Str("object_id", m.key.ID).
			Msg("Message Follow reached its hop limit; delivering from the store's owner record")
		go d.redeliverWorker(m.key)
	}
}

// takeRedeliveries pops the object's queued messages on the driver's
// goroutine; an empty queue ends the worker (the key is removed, so the
// next redelivery starts a new one).
func (d *Driver) takeRedeliveries(key location.AuthorityKey) []*actor.MessageEnvelope {
	out, _ := call(context.Background(), d, func() ([]*actor.MessageEnvelope, error) {
		q := d.redeliveries[key]
		if len(q) == 0 {
			delete(d.redeliveries, key)
			return nil, nil
		}
		d.redeliveries[key] = q[:0:0]
		return q, nil
	})
	return out
}

// redeliverWorker delivers an object's queued messages to the owner the
// store names, batch by batch, in order, with a fresh hop budget. If the
// object is gone, or no owner is reachable within redeliveryWindow, each
// message fails loudly: a request with a typed DeliveryFailed, a send
// logged and counted.
func (d *Driver) redeliverWorker(key location.AuthorityKey) {
	for {
		batch := d.takeRedeliveries(key)
		if len(batch) == 0 {
			return
		}
		pid, err := d.resolveWithin(key, redeliveryWindow)
		for _, env := range batch {
			if err != nil {
				d.failRedelivery(key, env, err)
				continue
			}
			h := maps.Clone(env.Header)
			h[HeaderHops] = "0" // a direct delivery; the generation header stays
			d.sys.Root.Send(pid, &actor.MessageEnvelope{Header: h, Message: env.Message, Sender: env.Sender})
		}
	}
}

// resolveWithin resolves key's current owner, retrying while the store or
// the owner's node is unavailable, for at most window.
func (d *Driver) resolveWithin(key location.AuthorityKey, window time.Duration) (*actor.PID, error) {
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		pid, err := d.Resolve(ctx, key)
		if err == nil || errors.Is(err, roamerr.ErrNotFound) {
			return pid, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

func (d *Driver) failRedelivery(key location.AuthorityKey, env *actor.MessageEnvelope, err error) {
	if env.Sender != nil {
		RespondFailure(d.sys, env.Sender, key.ID, err)
		return
	}
	d.metrics.sendUndelivered("send_redelivery_failed")
	d.log.Warn().Str("event", "send_redelivery_failed").Str("object_id", key.ID).Str("message_type", typeName(env.Message)).Err(err).
		Msg("a send past the Message Follow hop limit found no owner to deliver to")
}
