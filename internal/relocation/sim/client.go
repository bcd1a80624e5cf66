package sim

import (
	"strconv"
	"time"
)

// ObjID names an object (an Actor or Instance Spot key).
type ObjID int

// name is how a violation names the object ("" for none, -1).
func (o ObjID) name() string {
	if o < 0 {
		return ""
	}
	return "o" + strconv.Itoa(int(o))
}

// Object is the truth about one object across nodes: the length of its
// history (messages handled by whichever incarnation served it).
type Object struct {
	id   ObjID
	head int
	// spot is the SpotWide User Spot a member belongs to (-1: none);
	// members are a Spot's, in ID order (its participants 2..).
	spot    ObjID
	members []ObjID
}

// lossKind says why the last copy of an accepted message is gone.
type lossKind int

const (
	lossNone lossKind = iota
	// lossCrash: the node holding it crashed (expected).
	lossCrash
	// lossEnded: the node holding it ended its lifecycle or stopped; what
	// it held failed loudly or went with it (expected).
	lossEnded
	// lossFollow: forwarded by Message Follow on a link that was cut: the
	// transport drops it and Message Follow has no resend (a known limit,
	// docs/FAULTS.md "Sends to a node that has left").
	lossFollow
	// lossTransit: a relay record or a client's accepted message lost on a
	// cut link with no copy left.
	lossTransit
	// lossDeadLetter: it reached a PID with no actor after it was accepted.
	lossDeadLetter
	// lossDropped: the incarnation dispatched it without an application
	// instance (the host drops it silently).
	lossDropped
)

var lossNames = [...]string{"none", "crash", "ended", "follow-transit", "transit", "dead-letter", "dropped"}

// Msg is one application message from a client: a request (the client
// waits for an answer) or a one-way send, with a unique id and the
// client's sequence number.
type Msg struct {
	id      uint64
	client  int
	obj     ObjID
	seq     uint64
	request bool
	first   orderKey // the connection and incarnation it was sent to

	accepted bool // posted to some incarnation's mailbox
	handled  int
	failed   int // answered with a typed failure (request) or logged and counted (send)
	at       *Node
	loss     lossKind
	lossWhy  string
	exempt   bool // passed a move without its cutover: order not promised
	deadAt   *deadLetter
	dlCount  int
	dlFirst  time.Duration
	// viaSession: sent through the client's Session owner; held: held
	// there now (sealed binding), not sent yet.
	viaSession, held bool
}

type deadLetter struct {
	node *Node
	key  incKey
	inc  *Inc // the last incarnation of that name there, if any
}

// orderKey: one sender's messages on one connection to one incarnation.
type orderKey struct {
	client int
	node   int
	inc    incKey
}

type route struct {
	node     int
	ownerGen uint64
}

// Client sends requests and one-way sends to objects by the route it
// knows: the record it last resolved. It re-resolves when a message of it
// was followed (Config.OnFollow), answered with a failure, or dead-lettered.
type Client struct {
	w     *World
	id    int
	seq   uint64
	route map[ObjID]route
	last  map[orderKey]uint64
	gw    *gateway // its Session owner (Config.Sessions), else nil
}

func (c *Client) endpoint() int { return c.w.cfg.Nodes + c.id }

func (c *Client) stale(o ObjID) { delete(c.route, o) }

func (c *Client) resolve(o ObjID) route {
	if r, ok := c.route[o]; ok {
		return r
	}
	rec := c.w.store.Record(o)
	n := c.w.node(rec.OwnerNode)
	r := route{node: n.idx, ownerGen: rec.OwnerGen}
	c.route[o] = r
	return r
}

// send sends one message to o.
func (c *Client) send(o ObjID, request bool) {
	w := c.w
	if c.gw != nil && w.boundTo(o) == c.id {
		c.seq++
		m := &Msg{id: uint64(len(w.msgs) + 1), client: c.id, obj: o, seq: c.seq, request: request}
		w.msgs = append(w.msgs, m)
		w.stats.Messages++
		if w.Tracing() {
			w.tracef("c%d via %s m%d (seq %d, request %v) for o%d", c.id+1, c.gw.sid, m.id, m.seq, request, o)
		}
		c.sendViaSession(m)
		return
	}
	r := c.resolve(o)
	c.seq++
	m := &Msg{id: uint64(len(w.msgs) + 1), client: c.id, obj: o, seq: c.seq, request: request,
		first: orderKey{client: c.id, node: r.node, inc: incKey{obj: o, ownerGen: r.ownerGen}}}
	w.msgs = append(w.msgs, m)
	w.stats.Messages++
	if w.Tracing() {
		kind := "send"
		if request {
			kind = "request"
		}
		w.tracef("c%d %s m%d (seq %d) → %s o%d.%d", c.id+1, kind, m.id, m.seq, w.nodes[r.node].name, o, r.ownerGen)
	}
	w.net.send(&packet{from: c.endpoint(), to: r.node, kind: pClient, msg: m, inc: m.first.inc})
}

func (c *Client) receive(p *packet) {
	switch p.kind {
	case pSessionSeal, pSessionRoute, pSessionAbort:
		c.receiveSession(p)
		return
	}
	if p.kind == pAnswer && p.msg != nil {
		c.stale(p.msg.obj)
	}
}

// ---- outcomes ----

// place records that a live copy of m is now held at n.
func (w *World) place(m *Msg, n *Node) {
	m.at = n
	m.loss, m.lossWhy = lossNone, ""
}

// lostMsg records that a copy of m is gone; it is a loss only if no other
// copy is handled, failed or placed later.
func (w *World) lostMsg(m *Msg, kind lossKind, why string) {
	if m.handled > 0 || m.failed > 0 {
		return
	}
	if m.loss == lossCrash && kind == lossTransit {
		// The copy that held it crashed first (a source holding its
		// boundary batch); a resend of it still in flight on a cut link
		// changes nothing: without the crash the source would resend it.
		return
	}
	m.loss, m.lossWhy = kind, why
	if w.Tracing() {
		w.tracef("m%d copy lost (%s): %s", m.id, lossNames[kind], why)
	}
}

func (w *World) unaccepted(m *Msg, why string) {
	w.stats.Unaccepted++
	if w.Tracing() {
		w.tracef("m%d not accepted: %s", m.id, why)
	}
	if m.request {
		w.clients[m.client].stale(m.obj)
	}
}

// failLoud ends m with a loud failure: a request gets a typed failure
// answer, a send is logged and counted (never a silent drop).
func (w *World) failLoud(m *Msg, inc *Inc, why string) {
	m.failed++
	w.stats.FailedLoud++
	if w.Tracing() {
		w.tracef("%s m%d failed loudly: %s", inc, m.id, why)
	}
	if m.handled > 0 {
		w.violateO(m.obj, "failed-after-handled", "m%d was handled and then failed at %s: %s", m.id, inc, why)
	}
	if m.request {
		inc.node.send(w.cfg.Nodes+m.client, &packet{kind: pAnswer, msg: m})
	} else {
		w.clients[m.client].stale(m.obj)
	}
}

// ---- traffic ----

func (w *World) scheduleSend(at time.Duration, c *Client, o ObjID, request, refresh bool) {
	w.at(at, "client-send", func() {
		if w.over {
			return
		}
		if refresh {
			c.stale(o)
		}
		c.send(o, request)
	})
}
