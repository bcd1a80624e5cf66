package relocation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// SpotWide relocation (PROTOCOL.md §5.15): a User Spot of a SpotWide kind
// moves with every member it has at that moment, as one unit of the
// ordinary hand-off. The Spot is participant 1, its members follow in ID
// order; one seal of them all, one payload, one relay batch and cutover,
// and the target's one commit writes every record.

// MaxSpotWideMembers bounds a SpotWide unit: the Spot's record and its
// members' are written in one store transaction, and Consul takes at most
// 128 operations in one (its lease checks included). A Spot with more
// members is refused with CapacityExceeded before anything seals; give
// such a kind PerActor relocation (not SpotWide).
const MaxSpotWideMembers = 120

// RelocationReady is implemented by a SpotWide User Spot's actor that
// signals the end of its move itself (ApplicationSignaled): on the target,
// after the commit and before any participant's queue opens, roam calls
// OnRelocationReady on the Spot's goroutine with the members that moved
// with it.
type RelocationReady interface {
	OnRelocationReady(members []location.AuthorityKey)
}

// spotWideOf is the SpotWide User Spot on this node that obj is a member
// of, if any: such a member moves only with its Spot.
func (d *Driver) spotWideOf(obj *object) *object {
	if obj.r().member == nil {
		return nil
	}
	spot := d.objects[location.Key(location.KindUserSpot, obj.r().member.GetSpotId())]
	if spot == nil || !spot.kind.SpotWide || spot.generation != obj.r().member.GetSpotGeneration() {
		return nil
	}
	return spot
}

// spotWideMembers are the members of the SpotWide User Spot spot that move
// with it (want: the members its record counts), as admit.SpotWide
// decides from the incarnations here that name it.
func (d *Driver) spotWideMembers(spot *object, want int) ([]*object, error) {
	var objs []*object
	var cands []admit.Member
	for _, o := range d.objects {
		m := o.r().member
		if m == nil || m.GetSpotId() != spot.key.ID || m.GetSpotGeneration() != spot.generation {
			continue
		}
		objs = append(objs, o)
		cands = append(cands, admit.Member{Key: o.key, Opening: o.r().opening != nil,
			Busy:     o.state != serving || o.r().out != nil || o.flags.load(flagActivating) || o.r().changing > 0,
			Disabled: isDisabled(o.kind.Policy)})
	}
	picked, settling, err := admit.SpotWide(spot.key, int(spot.r().joining), want, cands, MaxSpotWideMembers)
	switch {
	case settling >= 0:
		return nil, &settlingError{done: objs[settling].r().opening.done, opening: objs[settling].r().opening}
	case err != nil:
		return nil, err
	}
	members := make([]*object, len(picked))
	for i, j := range picked {
		members[i] = objs[j]
	}
	return members, nil
}

// admitMembers runs admit.Members for a SpotWide Restore request, with the
// kinds and objects of this node.
func (d *Driver) admitMembers(key location.AuthorityKey, k *Kind, p *messages.RelocationPrepare) ([]*targetMember, messages.FailureReason, error) {
	ps := p.GetMembers()
	keys, reason, err := admit.Members(key, k.SpotWide, ps, MaxSpotWideMembers,
		func(stableType string) admit.MemberKind {
			mk, ok := d.kind(stableType)
			if !ok {
				return admit.MemberKind{}
			}
			return admit.MemberKind{Registered: true, ApplicationVersion: mk.ApplicationVersion}
		},
		func(mk location.AuthorityKey) bool { return d.objects[mk] != nil || d.arriving(mk) != nil })
	if err != nil || len(keys) == 0 {
		return nil, reason, err
	}
	members := make([]*targetMember, len(keys))
	for i, mk := range keys {
		mkind, _ := d.kind(ps[i].GetObject().GetStableType())
		members[i] = &targetMember{key: mk, kind: mkind, p: ps[i]}
	}
	return members, 0, nil
}

// readAll reads the records of keys at once (a store client that
// batches, like consulstore's, sends them together); a missing record
// reads as absent.
func (d *Driver) readAll(ctx context.Context, keys []location.AuthorityKey) ([]location.Versioned, error) {
	out := make([]location.Versioned, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := d.store.Read(ctx, key)
			if errors.Is(err, location.ErrNotFound) {
				v, err = location.Versioned{}, nil
			}
			out[i], errs[i] = v, err
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// verifyMembers reads each member's record for VerifySource
// (handoff.Commit.VerifyMembers judges them). spot is the Spot's own
// record.
func (d *Driver) verifyMembers(ctx context.Context, t *targetRun, spot *location.Record) error {
	if len(t.members) == 0 {
		return nil
	}
	c := d.commitPlan(t, false)
	vs, err := d.readAll(ctx, c.MemberKeys())
	if err != nil {
		return err
	}
	return c.VerifyMembers(spot, vs, d.slots.Bounded())
}

// openMembers gives each member its backlog (backlogs, in participant
// order), and opens the members' queues only once the Spot's
// RelocationReady callback, if it has one, ran on its goroutine — which it
// does before any message of the Spot's own backlog (PROTOCOL.md §5.15,
// ApplicationSignaled).
func (d *Driver) openMembers(t *targetRun, backlogs [][]any) {
	keys := make([]location.AuthorityKey, len(t.members))
	opening := &memberOpening{done: make(chan struct{})}
	for i, m := range t.members {
		keys[i] = m.key
		// Registered at once (calls find it), serving once its queue
		// opens; a move of the Spot meanwhile waits for that
		// (spotWideMembers).
		d.putObject(m.obj)
		m.obj.x().opening = opening
	}
	open := func() {
		for i, m := range t.members {
			if err := m.obj.mb.OpenWith(backlogs[i]); err != nil {
				d.log.Error().Str("event", "open_failed").Str("object_id", m.key.ID).Err(err).Msg("opening dispatch failed")
			}
			m.obj.x().opening = nil
			d.nowServing(m.obj)
			m.obj.checkpointsOnArrival(m.p.GetCheckpoint())
		}
		close(opening.done)
	}
	spot := t.obj
	err := spot.mb.Do(func() {
		defer d.loop.Post(open)
		if rr, ok := spot.inst.(RelocationReady); ok {
			opening.callback.Store(goroutineID())
			defer opening.callback.Store(0)
			rr.OnRelocationReady(keys)
		}
	})
	if err != nil {
		open()
	}
}

// memberOpening is what the members a SpotWide Spot brought wait for:
// their queues open once the Spot's RelocationReady callback returned
// (openMembers). A roam call for one of them, or a move of the Spot, waits
// for done; the same call made from inside that callback would wait for
// itself until its deadline, and with none for ever, holding the Spot and
// its members (the callback runs while they are held closed, and the call
// needs them open). Such a call is refused at once instead (refuseReentry;
// PROTOCOL.md §5.15). A call the callback makes on another goroutine and
// waits for is not recognised: it waits until its deadline.
type memberOpening struct {
	done chan struct{}
	// callback is the goroutine running the Spot's RelocationReady
	// callback, 0 when it is not running. Set and cleared on that
	// goroutine, read by the callers that would wait.
	callback atomic.Uint64
}

// refuseReentry is InvalidOperation when the calling goroutine is the one
// running the callback that opens o (nil o: nothing to wait for).
func (o *memberOpening) refuseReentry(key location.AuthorityKey) error {
	if o == nil {
		return nil
	}
	if g := o.callback.Load(); g != 0 && g == goroutineID() {
		return fmt.Errorf("%w: %s opens once its SpotWide Spot's OnRelocationReady returns, and this call was made from inside that callback: it cannot wait for itself", roamerr.ErrInvalidOperation, key)
	}
	return nil
}

// goroutineID is the calling goroutine's number, from its stack header
// ("goroutine N [..."). It only recognises a call made from inside an
// application callback roam waits for; nothing is scheduled by it.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		if id, err := strconv.ParseUint(string(b[:i]), 10, 64); err == nil {
			return id
		}
	}
	return 0
}
