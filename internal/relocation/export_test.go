package relocation

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/roamactors/roam/location"
)

// DropInbound makes d's relocation actor drop every message drop reports
// true for, as a cut link would (nil: drop nothing).
func DropInbound(d *Driver, drop func(any) bool) {
	if drop == nil {
		d.dropInbound.Store(nil)
		return
	}
	d.dropInbound.Store(&drop)
}

// SetDeadLetterPatience changes how long the driver keeps redelivering a
// dead-lettered send (30 s), so that a test can go past it quickly.
func (d *Driver) SetDeadLetterPatience(p time.Duration) {
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		d.deadLetterPatience = p
		return struct{}{}, nil
	})
}

// Arriving reports whether d has a move of key into its node in progress.
func Arriving(d *Driver, key location.AuthorityKey) bool {
	v, _ := call(context.Background(), d, func() (bool, error) { return d.arriving(key) != nil, nil })
	return v
}

// WithoutSourceCheck makes d answer capability queries as a node of a
// version without the source check before the seal: its moves in are
// checked after their Restore request (PROTOCOL.md §5.2, §5.7).
func WithoutSourceCheck(d *Driver) {
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		d.noSourceCheck = true
		return struct{}{}, nil
	})
}

// PrecheckedRestores is how many Restore requests d took the record of
// their source check for, instead of reading it.
func PrecheckedRestores(d *Driver) int {
	v, _ := call(context.Background(), d, func() (int, error) { return d.prechecks.taken, nil })
	return v
}

// RunningTimers is how many move timers d has running.
func RunningTimers(d *Driver) int {
	return d.loop.ArmedTimers()
}

// InFlight is how many payload bytes d counts in flight to peer.
func InFlight(d *Driver, peer string) int64 {
	v, _ := call(context.Background(), d, func() (int64, error) { return d.budget.InFlight(peer), nil })
	return v
}

// SetSpareFresh changes how long spare move tickets serve further moves.
func SetSpareFresh(d *Driver, fresh time.Duration) {
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		d.spareFresh = fresh
		return struct{}{}, nil
	})
}

// SpareTicketsHeld is how many spare tickets d, as a target, keeps for the
// source at address.
func SpareTicketsHeld(d *Driver, address string) int {
	v, _ := call(context.Background(), d, func() (int, error) { return d.tickets.Spares(address), nil })
	return v
}

// LinkedChunks is how many chunks d read from its chunk link, and how many
// of them in place.
func LinkedChunks(d *Driver) (linked, inPlace int64) {
	return d.linked.Load(), d.linkedInPlace.Load()
}

// CloseChunkLink closes d's chunk link, as a failed link would be.
func CloseChunkLink(d *Driver) {
	if d.link != nil {
		d.link.Close()
	}
}

// ChunkLinkDown reports whether d sends peer's chunks on the Proto.Actor
// connection after its link failed.
func ChunkLinkDown(d *Driver, peer string) bool {
	v, _ := call(context.Background(), d, func() (bool, error) {
		_, down := d.linkDown[peer]
		return down, nil
	})
	return v
}

// Leaving reports whether d's object key has begun to seal for a move.
func Leaving(d *Driver, key location.AuthorityKey) bool {
	v, _ := call(context.Background(), d, func() (bool, error) {
		o := d.objects[key]
		return o != nil && o.state == leaving, nil
	})
	return v
}

// EndSinkFor is what an ended incarnation of key on d does with what
// reaches it: fail a request, count and log a send (event).
func EndSinkFor(d *Driver, key location.AuthorityKey, event string) func(msg any) {
	return d.endSink(&object{key: key}, "unavailable", event, "ended in a test")
}

// Draining is how many of d's redelivery workers wait for a route barrier
// down a Message Follow hop (drainHop).
func Draining(d *Driver) int64 { return d.draining.Load() }

// Runs is how many moves out of (sources) and into (targets) d's node it
// still keeps, and how many incarnations it has not stopped (live).
func Runs(d *Driver) (sources, targets, live int) {
	type runs struct{ s, t int }
	v, _ := call(context.Background(), d, func() (runs, error) { return runs{len(d.sources), len(d.targets)}, nil })
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	return v.s, v.t, len(d.live) - len(d.liveFree)
}

// HeldAfterCutover is how many messages d's move of key holds since its
// cutover, waiting to follow (0 when no move of key holds any).
func HeldAfterCutover(d *Driver, key location.AuthorityKey) int {
	v, _ := call(context.Background(), d, func() (int, error) {
		for _, r := range d.sources {
			if r.obj.key == key && r.run.Parts[0].Held != nil {
				return len(r.run.Parts[0].Held.Waiting()), nil
			}
		}
		return 0, nil
	})
	return v
}

// ContextExtras reports whether the context of key's incarnation on d has
// Proto.Actor's context extras (about 200 bytes, made for middleware,
// Context.Set, watchers, stashes or children), read on the incarnation's
// own goroutine between its turns.
func ContextExtras(ctx context.Context, d *Driver, key location.AuthorityKey) (bool, error) {
	obj, err := call(ctx, d, func() (*object, error) {
		o := d.objects[key]
		if o == nil {
			return nil, fmt.Errorf("no incarnation of %s", key)
		}
		return o, nil
	})
	if err != nil {
		return false, err
	}
	answer := make(chan bool, 1)
	if err := obj.mb.Do(func() {
		v := reflect.ValueOf(obj.hc.Context)
		answer <- v.Kind() == reflect.Pointer && !v.Elem().FieldByName("extras").IsNil()
	}); err != nil {
		return false, err
	}
	select {
	case has := <-answer:
		return has, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// LoadCounted is d's load as it keeps it and as counted over every
// incarnation: the two must agree. An error if d no longer answers.
func LoadCounted(d *Driver) (kept, counted [2]int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := call(ctx, d, func() ([2][2]int, error) {
		h, a := d.load()
		rh, ra := d.recount()
		return [2][2]int{{h, a}, {rh, ra}}, nil
	})
	return v[0], v[1], err
}
