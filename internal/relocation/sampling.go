package relocation

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// HeaderFrom names a sampled message's sender for co-location
// (docs/PLACEMENT.md §5): "<kind>\n<node RID>\n<ID>". One message in
// Config.SampleEvery sent by a relocatable object carries it; the
// receiving object counts it in its node's edge table. A forged value
// only adds to that table (bounded) and so only to which idle moves the
// director considers.
const HeaderFrom = "roam-from"

// sample is what the incarnation's actor sends to pid in place of
// message when sampling is on (hostContext.send): one message in every
// is stamped with its sending object. A reply to a future goes to no
// object and is not stamped.
func (o *object) sample(pid *actor.PID, message any, every int) any {
	if rand.IntN(every) != 0 || isFuture(pid) || o.d == nil {
		return message
	}
	return withHeader(actor.WrapEnvelope(message), HeaderFrom, o.tag())
}

// SenderTag is the HeaderFrom value naming the object whose actor context
// c is, for one call in SampleEvery; "" otherwise (not a relocatable
// object, sampling off, or not sampled this time). A Spot call made from
// an object's turn stamps it (spot.Call.From).
func SenderTag(c actor.Context) string {
	if c == nil {
		return ""
	}
	o, ok := c.Get(hostExtensionID).(*object)
	if !ok || o.d == nil || o.d.cfg.SampleEvery <= 0 || rand.IntN(o.d.cfg.SampleEvery) != 0 {
		return ""
	}
	return o.tag()
}

func (o *object) tag() string {
	return strconv.Itoa(int(o.key.Kind)) + "\n" + o.d.desc.GetNodeRid() + "\n" + o.key.ID
}

// withHeader is env with key set, the caller's envelope and header left
// as they were.
func withHeader(env *actor.MessageEnvelope, key, value string) *actor.MessageEnvelope {
	h := make(map[string]string, len(env.Header)+1)
	maps.Copy(h, env.Header)
	h[key] = value
	return &actor.MessageEnvelope{Header: h, Message: env.Message, Sender: env.Sender}
}

// recordEdge counts a sampled message from the sender that tag names to
// o; a malformed tag is ignored (it names no object).
func (o *object) recordEdge(tag string) {
	kind, rest, ok1 := strings.Cut(tag, "\n")
	node, id, ok2 := strings.Cut(rest, "\n")
	k, err := strconv.Atoi(kind)
	if !ok1 || !ok2 || err != nil || len(node) > location.MaxIDBytes {
		return
	}
	from := location.Key(location.Kind(k), id)
	if from.Validate() != nil || from == o.key {
		return
	}
	o.d.cfg.Edges.Record(from, node, o.key, o.d.clock.Now())
}

// sampleLoad counts one application message in SampleEvery into o's load
// (placement's balance by load).
func (o *object) sampleLoad() {
	if rand.IntN(o.d.cfg.SampleEvery) == 0 {
		o.d.cfg.Edges.RecordLoad(o.key, o.d.clock.Now())
	}
}

// onEdgeQuery answers a live node of the mesh with this node's edge table
// (the objects it hosts are not told to anyone else).
func (d *Driver) onEdgeQuery(c actor.Context, q *messages.EdgeQuery) {
	d.answerMember(c, "edge query", q.GetSource(), func(to *actor.PID, refusal string) {
		switch {
		case refusal != "":
			d.sys.Root.Send(to, &messages.EdgeReply{Reason: refusal})
			return
		case d.cfg.Edges == nil:
			d.sys.Root.Send(to, &messages.EdgeReply{Reason: "this node does not sample its objects' traffic"})
			return
		}
		// Only the objects serving here (the driver goroutine knows
		// them): a receiver that left is counted by its new node. The
		// sort and the answer are done off it.
		here := func(k location.AuthorityKey) bool {
			o := d.objects[k]
			return o != nil && o.state == serving
		}
		now := d.clock.Now()
		edges, loads := d.cfg.Edges.Snapshot(here, now), d.cfg.Edges.Loads(here, now)
		go func() {
			edges = placement.Heaviest(edges, int(min(q.GetMax(), maxEdgeReply)))
			reply := &messages.EdgeReply{Edges: make([]*messages.SampledEdge, 0, len(edges))}
			size := 0
			for _, e := range edges {
				// Within the transport's message size whatever the IDs'
				// lengths: the lightest edges are left out.
				if size += len(e.From.ID) + len(e.To.ID) + len(e.FromNode) + 32; size > maxEdgeReplyBytes {
					break
				}
				reply.Edges = append(reply.Edges, &messages.SampledEdge{FromKind: e.From.Kind, FromId: e.From.ID, FromNode: e.FromNode, ToKind: e.To.Kind, ToId: e.To.ID, Weight: e.Weight})
			}
			for _, l := range loads {
				reply.NodeLoad += l.Weight
			}
			size = 0
			for _, l := range placement.HeaviestLoads(loads, int(min(q.GetMax(), maxEdgeReply))) {
				if size += len(l.Key.ID) + 24; size > maxEdgeReplyBytes {
					break
				}
				reply.Loads = append(reply.Loads, &messages.SampledLoad{Kind: l.Key.Kind, Id: l.Key.ID, Weight: l.Weight})
			}
			d.sys.Root.Send(to, reply)
		}()
	})
}

// maxEdgeReply and maxEdgeReplyBytes bound an answer, well within the
// transport's message size (4 MiB).
const (
	maxEdgeReply      = 32768
	maxEdgeReplyBytes = 2 << 20
)

// Edges asks the node at address for the heaviest max edges and loads of
// its table.
func (d *Driver) Edges(ctx context.Context, address string, max int) (placement.Sample, error) {
	timeout := d.cfg.CapabilityTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, machine.Until(d.clock, dl))
	}
	if timeout <= 0 {
		return placement.Sample{}, fmt.Errorf("%w: edges of %s: %w", roamerr.ErrDeadlineExceeded, address, context.DeadlineExceeded)
	}
	res, err := ask.Ask(ctx, d.sys, PID(address), &messages.EdgeQuery{Source: d.selfRef(), Max: uint32(max)}, timeout, ask.Question{Clock: d.clock, From: address, What: "edge query",
		Accept: func(msg any) bool { _, ok := msg.(*messages.EdgeReply); return ok }})
	if err != nil {
		return placement.Sample{}, fmt.Errorf("%w: edges of %s: %v", roamerr.ErrUnavailable, address, err)
	}
	reply, ok := res.(*messages.EdgeReply)
	switch {
	case !ok:
		return placement.Sample{}, fmt.Errorf("%w: edges of %s: answered %T", roamerr.ErrUnavailable, address, res)
	case reply.GetReason() != "":
		return placement.Sample{}, fmt.Errorf("%w: edges of %s: %s", roamerr.ErrUnavailable, address, reply.GetReason())
	}
	out := placement.Sample{NodeLoad: reply.GetNodeLoad()}
	for _, e := range reply.GetEdges() {
		out.Edges = append(out.Edges, placement.Edge{From: location.Key(e.GetFromKind(), e.GetFromId()), FromNode: e.GetFromNode(),
			To: location.Key(e.GetToKind(), e.GetToId()), Weight: e.GetWeight()})
	}
	for _, l := range reply.GetLoads() {
		out.Loads = append(out.Loads, placement.Load{Key: location.Key(l.GetKind(), l.GetId()), Weight: l.GetWeight()})
	}
	return out, nil
}
