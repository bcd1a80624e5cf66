package relocation

import (
	"crypto/x509"
	"maps"
	"net"
	"strconv"
	"time"

	"github.com/roamactors/roam/internal/chunklink"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
	"github.com/roamactors/roam/messages"
)

// State chunks on the chunk link (docs/PROTOCOL.md §4.4): a target
// announces its link in capability answers; a source sends a move's
// chunks there instead of on the Proto.Actor connection, which then
// carries no large payload ahead of other messages between the two nodes.
// Everything else of the hand-off stays on the Proto.Actor connection.

const (
	// linkDownFor: after a peer's link failed, its chunks go on the
	// Proto.Actor connection this long before the link is tried again,
	// doubled at each failure in a row up to linkDownMax (a link peers
	// cannot reach costs a dial timeout each time it is tried).
	linkDownFor = 30 * time.Second
	linkDownMax = 10 * time.Minute
	// earlyKeep: how long a chunk that came before its Restore request is
	// kept for it.
	earlyKeep = 10 * time.Second
	// linkPortWait: how long a new node lifecycle tries a fixed link port
	// that is in use.
	linkPortWait = 5 * time.Second
)

// linkedChunk is a chunk read from the link, on its way to the driver's
// goroutine; from is the address its sender declared (checked as a
// Proto.Actor sender's address is).
type linkedChunk struct {
	from  string
	m     *messages.RelocationState
	whole []byte // the buffer m.Data lies in, if the link read it in place
	at    time.Time
}

// chunkLinkLost: chunks sent to peer on the link may not have arrived.
type chunkLinkLost struct{ peer string }

// startLink starts the node's chunk link, unless the configuration turns
// it off.
func (d *Driver) startLink(node *meshnode.Node) error {
	if d.cfg.ChunkLinkPort < 0 {
		return nil
	}
	ls := node.LinkSettings()
	host, _, err := net.SplitHostPort(node.Address())
	if err != nil {
		return err
	}
	self := d.sys.NewLocalPID(DriverName)
	var certified func(leaf *x509.Certificate, address string) bool
	if ls.Server != nil {
		certified = ls.Certified
	}
	cfg := chunklink.Config{
		Listen:    net.JoinHostPort(ls.Host, strconv.Itoa(d.cfg.ChunkLinkPort)),
		Advertise: net.JoinHostPort(host, "0"),
		Self:      node.Address(),
		Server:    ls.Server, Client: ls.Client, Certified: certified,
		MaxData: d.cfg.Handoff.ChunkLimit,
		// The driver's PID by name: the link listens before it is spawned,
		// and a chunk that comes sooner is dead-lettered.
		Deliver: func(from string, m *messages.RelocationState, whole []byte) {
			d.sys.Root.Send(self, &linkedChunk{from: from, m: m, whole: whole, at: d.clock.Now()})
		},
		Lost:   func(peer string) { d.sys.Root.Send(self, &chunkLinkLost{peer: peer}) },
		Logger: *d.cfg.Logger,
	}
	l, err := chunklink.Listen(cfg)
	// A fixed port may still be held by the link of the node lifecycle
	// that just ended (it closes once that lifecycle's stop is seen).
	if err != nil && d.cfg.ChunkLinkPort > 0 {
		d.log.Warn().Str("event", "chunk_link_port_in_use").Int("port", d.cfg.ChunkLinkPort).Err(err).
			Msg("the chunk link's port is in use; trying again for a few seconds")
		// Pacing on real time: the port is the OS's, not the protocol's.
		for wait := machine.Real.Now().Add(linkPortWait); err != nil && machine.Real.Now().Before(wait); {
			<-machine.After(machine.Real, 50*time.Millisecond)
			l, err = chunklink.Listen(cfg)
		}
	}
	if err != nil {
		return err
	}
	d.link = l
	return nil
}

// linkTo is the chunk link address to send peer's chunks to, "" for the
// Proto.Actor connection.
func (d *Driver) linkTo(peer string) string {
	if d.link == nil {
		return ""
	}
	if until, down := d.linkDown[peer]; down {
		if d.clock.Now().Before(until) {
			return ""
		}
		delete(d.linkDown, peer)
	}
	return d.chunkLinks[peer]
}

// setChunkLink records the link a peer announced in a capability answer.
// A link is only taken on the peer's own host: an answer must not send
// a move's state anywhere else.
func (d *Driver) setChunkLink(peer, link string) {
	if link == "" {
		delete(d.chunkLinks, peer)
		return
	}
	ph, _, err1 := net.SplitHostPort(peer)
	lh, _, err2 := net.SplitHostPort(link)
	if err1 != nil || err2 != nil || ph != lh {
		delete(d.chunkLinks, peer)
		d.refused("capability answer", peer, "announces a chunk link "+strconv.Quote(link)+" off its own host")
		return
	}
	if d.chunkLinks[peer] != link {
		// A new link (the peer restarted): try it.
		delete(d.linkDown, peer)
		delete(d.linkFailures, peer)
	}
	d.chunkLinks[peer] = link
}

// sendChunk sends one chunk of run r, on the link if the target has one
// and the payload is more than one chunk: a payload of one chunk (most
// moves) is small, holds up nothing behind it, and on the Proto.Actor
// connection arrives right behind its Restore request, with no hop
// through the link's reader.
func (d *Driver) sendChunk(r *sourceRun, c envelope.Chunk) {
	m := &messages.RelocationState{Identity: r.wire.of(r.m.Identity()), Index: c.Index, Offset: c.Offset, Data: c.Data}
	peer := r.target.GetAddress()
	if r.outcome.Chunks > 1 {
		if to := d.linkTo(peer); to != "" && d.link.Send(peer, to, m, r.outcome.Bytes) == nil {
			return
		}
	}
	d.send(r.targetPID, m)
}

// onLinkedChunk steps the chunk's target run, or keeps the chunk for its
// Restore request, which comes on the other connection and may come after.
func (d *Driver) onLinkedChunk(lc *linkedChunk) {
	d.linked.Add(1)
	if lc.whole != nil {
		d.linkedInPlace.Add(1)
	}
	id := handoff.IdentityFromProto(lc.m.GetIdentity())
	t := d.targets[id]
	if t == nil {
		d.early.add(id, lc)
		return
	}
	if t.sourcePID.Address != lc.from {
		return // attributed by identity and sender, as on the Proto.Actor connection
	}
	d.stepTarget(t, handoff.ChunkReceived{Chunk: lc.chunk()})
}

func (lc *linkedChunk) chunk() envelope.Chunk {
	return envelope.Chunk{Index: lc.m.GetIndex(), Offset: lc.m.GetOffset(), Data: lc.m.GetData(), Backing: lc.whole}
}

// expectChunks has the link read a new target run's chunks in place.
func (d *Driver) expectChunks(t *targetRun) {
	if d.link != nil {
		d.link.Expect(t.sourcePID.Address, t.prepare.GetIdentity(), t.prepare.GetManifest().GetPayloadTotalLength())
	}
}

// forgetChunks ends expectChunks.
func (d *Driver) forgetChunks(t *targetRun) {
	if d.link != nil {
		d.link.Forget(t.sourcePID.Address, t.prepare.GetIdentity())
	}
}

// replayEarly steps a new target run with the chunks that came before it.
func (d *Driver) replayEarly(id handoff.Identity) {
	for _, lc := range d.early.take(id) {
		if t := d.targets[id]; t != nil {
			if t.sourcePID.Address == lc.from {
				d.stepTarget(t, handoff.ChunkReceived{Chunk: lc.chunk()})
			}
		}
	}
}

// onChunkLinkLost sends peer's chunks on the Proto.Actor connection for a
// while and resends, as after a lost connection, what its targets may
// not have: the budget their lost chunks held is given back first, or a
// window's worth of lost chunks would keep the resent ones from going.
func (d *Driver) onChunkLinkLost(peer string) {
	if d.link == nil {
		return
	}
	d.linkFailures[peer]++
	down := linkDownFor << min(d.linkFailures[peer]-1, 5)
	d.linkDown[peer] = d.clock.Now().Add(min(down, linkDownMax))
	d.connectionLost(peer)
}

// connectionLost steps every move to peer with ConnectionLost, after
// giving back the budget of what they sent and was not credited: without
// that, a window's worth of lost chunks would keep the resent ones from
// going.
func (d *Driver) connectionLost(peer string) {
	sourcerun.ConnectionLost(maps.Values(d.sources), func(r *sourceRun) bool { return r.target.GetAddress() == peer },
		func() { d.budgetOut(d.budget.LostPeer(peer)) }, d.stepSource)
}

// earlyChunks keeps chunks that came on the link before their Restore
// request, oldest first, within a byte limit and earlyKeep: a chunk for a
// move that never starts here (a forgery, or one resent after its move
// ended) only ages out.
type earlyChunks struct {
	limit int64
	bytes int64
	list  []earlyChunk
}

type earlyChunk struct {
	id handoff.Identity
	lc *linkedChunk
}

func (e *earlyChunks) add(id handoff.Identity, lc *linkedChunk) {
	e.expire(lc.at)
	n := int64(len(lc.m.GetData()))
	for len(e.list) > 0 && e.bytes+n > e.limit {
		e.bytes -= int64(len(e.list[0].lc.m.GetData()))
		e.list[0] = earlyChunk{}
		e.list = e.list[1:]
	}
	if n > e.limit {
		return
	}
	e.list = append(e.list, earlyChunk{id: id, lc: lc})
	e.bytes += n
}

func (e *earlyChunks) expire(now time.Time) {
	for len(e.list) > 0 && now.Sub(e.list[0].lc.at) > earlyKeep {
		e.bytes -= int64(len(e.list[0].lc.m.GetData()))
		e.list[0] = earlyChunk{}
		e.list = e.list[1:]
	}
	if len(e.list) == 0 {
		e.list = nil
	}
}

func (e *earlyChunks) take(id handoff.Identity) []*linkedChunk {
	if len(e.list) == 0 {
		return nil
	}
	var out []*linkedChunk
	kept := e.list[:0]
	for _, c := range e.list {
		if c.id == id {
			out = append(out, c.lc)
			e.bytes -= int64(len(c.lc.m.GetData()))
			continue
		}
		kept = append(kept, c)
	}
	clear(e.list[len(kept):])
	e.list = kept
	return out
}
