package spotsim

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Spot is the truth about one Spot ID across lifecycles: its kind, the
// incarnation that last opened, and whether its state legitimately ended
// since (its record was deleted: a close's release).
type Spot struct {
	w          *World
	idx        int
	id         string
	kind       activation.Kind
	stableType string
	live       *Inc
	released   bool
	// cpClaims counts the claims of its checkpoint: each fences out every
	// incarnation staged before it (the checker's, check.go).
	cpClaims int
}

func (s *Spot) key() location.AuthorityKey { return location.Key(location.KindInstanceSpot, s.id) }

func (s *Spot) userKey() location.AuthorityKey { return location.Key(location.KindUserSpot, s.id) }

// lossKind says why the last live copy of an accepted message is gone.
type lossKind int

const (
	lossNone lossKind = iota
	// lossCrash: the lifecycle holding it crashed (expected).
	lossCrash
	// lossEnded: the lifecycle holding it ended and its process went
	// (expected; what it held as an owner failed loudly).
	lossEnded
	// lossTransit: an accepted send (or a forwarded first message) lost
	// on a cut link or to a node that went down: a send already written
	// to a connection that resets is lost with it (docs/FAULTS.md).
	lossTransit
	// lossRoot: its only durable copy, the recovery root, was deleted
	// while nobody held it, ran it or failed it.
	lossRoot
)

var lossNames = [...]string{"none", "crash", "ended", "transit", "root-deleted"}

// Msg is one call's application message: a request or a one-way send to
// a Spot, with its operation, its client's sequence number and what
// became of it.
type Msg struct {
	id      int
	client  *Client
	spot    *Spot
	seq     int
	request bool
	op      string
	// deadline is the call's deadline (a request's roam-deadline header).
	deadline time.Duration
	key      orderKey
	call     *Call
	probe    bool

	accepted bool // its envelope reached a node, it was posted to a mailbox, or the caller was told it was sent
	handled  []*Inc
	// handledAt: when each handling's handler returned.
	handledAt []time.Duration
	failures  []failure // loud failures by the system (typed answer, or logged and counted)
	silent    bool      // dropped without an answer or a log line
	at        *Life     // where its live copy is, if anywhere
	loss      lossKind
	lossWhy   string
	passedOn  bool // its activation was passed on for capacity (order not promised)
	// viaCmd39: its call sent it in a SpotActivation; sentAt: when its call
	// handed it to the transport; deliveredAt: when it first reached an
	// incarnation's mailbox, or the head of an opening one (0: not yet).
	viaCmd39 bool
	// notice: a send that went in a SpotActivation; its call returns when the
	// incarnation dispatches it (or a failure comes back), so the caller's
	// next call cannot overtake it (call.go sendActivation).
	notice      bool
	target      *Life // the lifecycle its call sent it to
	sentAt      time.Duration
	deliveredAt time.Duration
	dlCount     int
	dlFirst     time.Duration
	// cmd39DeadLetter: its SpotActivation became a dead letter at the sender
	// (its target's process was known gone).
	cmd39DeadLetter bool
}

// open: neither handled nor failed.
func (m *Msg) open() bool { return len(m.handled) == 0 && len(m.failures) == 0 && !m.silent }

func (m *Msg) String() string { return fmt.Sprintf("m%d", m.id) }

// place records that a live copy of m is now held at l.
func (w *World) place(m *Msg, l *Life) {
	m.at = l
	m.loss, m.lossWhy = lossNone, ""
}

// lostMsg records that a copy of m is gone; it is a loss only if no other
// copy is handled, failed or placed later.
func (w *World) lostMsg(m *Msg, kind lossKind, why string) {
	if !m.open() {
		return
	}
	m.loss, m.lossWhy = kind, why
	if m.at != nil && m.at.gone {
		m.at = nil
	}
	if w.Tracing() {
		w.tracef("m%d copy lost (%s): %s", m.id, lossNames[kind], why)
	}
}

// failLoud records a loud failure of m by lifecycle l: a request's typed
// answer, or a send's log line and counter. A definite failure says the
// message did not run.
func (w *World) failLoud(m *Msg, l *Life, f failure) {
	m.failures = append(m.failures, f)
	if f.definite {
		w.stats.FailedLoud++
	} else {
		w.stats.FailedMaybe++
	}
	if w.Tracing() {
		kind := "send"
		if m.request {
			kind = "request"
		}
		w.tracef("%s m%d (%s) failed loudly: %s %s (definite=%v)", l, m.id, kind, f.code, f.why, f.definite)
	}
	if len(m.handled) > 0 && f.definite {
		v := w.violate("failed-after-handled", "m%d (c%d seq %d to %s) was handled by %s and then failed at %s as not run: %s", m.id, m.client.id+1, m.seq, m.spot.id, m.handled[0], l, f.why)
		v.Obj, v.Msg = m.spot.id, m.id
	}
}

// silentDrop records that m was dropped without an answer or a log line.
func (w *World) silentDrop(m *Msg, inc *Inc, why string) {
	m.silent = true
	v := w.violate("silent-drop", "m%d (c%d seq %d, a send to %s) was dropped silently at %s: %s", m.id, m.client.id+1, m.seq, m.spot.id, inc, why)
	v.Obj, v.Msg = m.spot.id, m.id
}

// code is the roamerr code of err.
func code(err error) string { return roamerr.Code(err) }

func isNotFound(err error) bool { return errors.Is(err, location.ErrNotFound) }

var errNotServing = fmt.Errorf("%w: the incarnation does not serve here", roamerr.ErrNotFound)

func genString(g uint64) string {
	if g == 0 {
		return "g0"
	}
	return fmt.Sprintf("g%d", (int64(g)-simkit.Base.UnixNano())/int64(time.Microsecond))
}
