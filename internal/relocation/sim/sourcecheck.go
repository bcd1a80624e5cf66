package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// The source check before the seal (docs/PROTOCOL.md §5.2), as the
// driver's sourcecheck.go answers it: the target reads the record, judges
// it with the move's identity, keeps it for the Restore request of the
// same move (Prechecked), and answers. (The sim's nodes are all members:
// no peer check.)

// precheck is a source check's record, kept for its Restore request.
type precheck struct {
	v        location.Versioned
	obj      ObjID
	source   int
	deadline time.Duration
}

func (n *Node) onSourceCheck(p *packet) {
	w := n.w
	reply := func(err error) {
		w.stats.SourceChecks++
		out := &packet{kind: pSourceCheckReply, id: p.id}
		if err != nil {
			w.stats.SourceChecksRefused++
			out.code, out.detail = roamerr.Code(err), err.Error()
		}
		n.send(p.from, out)
	}
	switch {
	case !p.id.Valid() || p.prep.source != p.from:
		return // refused unanswered, as the driver's
	case n.stopping:
		reply(fmt.Errorf("%w: %w: %s takes no move in", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, n.name))
		return
	case !n.valid():
		reply(fmt.Errorf("%w: the target node's owner lease is not in force", roamerr.ErrUnavailable))
		return
	}
	until := w.Now() + (p.prep.deadline-w.Now())/2
	n.trySourceCheck(p, n.life, until, 0, reply)
}

// trySourceCheck is one try of the check, judged as the driver's
// trySourceCheck judges it: an answer that says nothing of the source is
// tried again (handoff.VerifyAgain's pacing) until until, then it is
// Unavailable; a record that does not back the source is Stale.
func (n *Node) trySourceCheck(p *packet, life int, until, prev time.Duration, reply func(error)) {
	w := n.w
	id, obj := p.id, p.prep.obj
	w.store.call(n, storeOp{kind: opRead, obj: obj, why: fmt.Sprintf("source check #%d", id.RelocationID)}, until, func(res storeRes) {
		var v location.Versioned
		var err error
		if res.err != errNone {
			err = readError(res.err)
		} else {
			v = versionedOf(w.keyOf(obj), res.rec)
			err = id.JudgeSource(handoff.ViewOf(v), 1)
		}
		again, wait := handoff.VerifyAgain(err, false, prev)
		if !again {
			if err == nil {
				if n.prechecks == nil {
					n.prechecks = map[handoff.Identity]precheck{}
				}
				n.prechecks[id] = precheck{v: v, obj: obj, source: p.from, deadline: p.prep.deadline}
			}
			reply(roamerr.Wrap(roamerr.ErrStale, "source check", err))
			return
		}
		epoch := time.Unix(0, 0)
		pause, expired := handoff.VerifyPause(epoch.Add(w.Now()), epoch.Add(until), wait)
		if expired {
			reply(roamerr.Keep(roamerr.ErrUnavailable, "source check: nothing said whether the store backs the source in time", err))
			return
		}
		w.after(pause, "source-check-retry", func() {
			if n.alive && n.life == life {
				n.trySourceCheck(p, life, until, wait, reply)
			}
		})
	})
}

// Prechecked takes what the source check of this move found, if it
// passed on this lifecycle, for the same object, from the same source,
// before the move's deadline; it answers in a turn of its own.
func (e targetEnv) Prechecked(answer func(location.Versioned)) bool {
	t := e.t
	id := t.m.Identity()
	pc, ok := t.node.prechecks[id]
	if !ok {
		return false
	}
	delete(t.node.prechecks, id)
	if pc.obj != t.obj || pc.source != t.source.idx || t.w.Now() > pc.deadline {
		return false
	}
	t.w.stats.Prechecked++
	t.w.after(0, "precheck", func() {
		if !t.dead {
			answer(pc.v)
		}
	})
	return true
}
