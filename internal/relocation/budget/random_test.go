package budget

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// rmove is one move in the random model: its payload, what its current
// connection carries, and what its target got.
type rmove struct {
	id      uint64
	peer    string
	payload []envelope.Chunk
	state   int // rWaiting, rSealing, rSending, rReturned, rEnded
	wire    []envelope.Chunk
	credits []uint64 // credits on their way back
	// the target's side
	received uint64
	got      map[uint32]bool
	ready    bool // relay-ready on its way back
}

const (
	rWaiting = iota + 1
	rSealing // admitted: its seal and capture are under way
	rSending
	rReturned
	rEnded
)

// TestRandomCallSequences drives the budget as the driver does, with
// moves to several peers under random bounds and chunk sizes above and
// below them: admissions, chunks handed over and delivered, credits
// (counting resent chunks too), lost connections with their resends,
// relay-ready returns and failures that end a move at any point. After
// every call nothing that fits waits (Stalled), no bound is passed except
// by a single chunk, and no chunk goes for a move that ended or returned
// its budget; once everything in flight has arrived every move has been
// admitted and ended, leaving the budget idle.
// Reference: docs/PROTOCOL.md §5.3.
func TestRandomCallSequences(t *testing.T) {
	for seed := uint64(1); seed <= 400; seed++ {
		if err := randomSequence(seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func randomSequence(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0))
	bound := func() int64 {
		if rng.IntN(3) == 0 {
			return 0
		}
		return 10 + rng.Int64N(200)
	}
	perPeer, perNode, window := bound(), bound(), bound()
	b := New(perPeer, perNode, window)
	peers := []string{"p0", "p1", "p2"}[:1+rng.IntN(3)]
	var moves []*rmove
	byID := map[uint64]*rmove{}
	var maxChunk int64
	var trace []string
	fail := func(format string, args ...any) error {
		return fmt.Errorf("bounds %d/%d/%d: %s\ntrace: %v\nbudget: %s", perPeer, perNode, window, fmt.Sprintf(format, args...), trace, b)
	}

	submit := func(m *rmove) Out {
		m.state = rSending
		return b.Submit(m.peer, m.id, m.payload)
	}
	// At most budget ÷ window moves to a peer seal at once beyond the
	// first (one at a time without a window): the rest wait, serving.
	maxSealing := 1
	if perPeer > 0 && window > 0 && window < perPeer {
		maxSealing += int(perPeer / window)
	}
	admitted := func(m *rmove) error {
		n := 1
		for _, o := range moves {
			if o.peer == m.peer && o.state == rSealing {
				n++
			}
		}
		if perPeer > 0 && n > maxSealing {
			return fail("move %d admitted while %d moves to %s seal", m.id, n-1, m.peer)
		}
		m.state = rSealing
		return nil
	}
	var apply func(out Out) error
	apply = func(out Out) error {
		for _, q := range out.Chunks {
			m := byID[q.Run]
			if m == nil || m.state != rSending {
				return fail("a chunk of move %d (state %v) goes", q.Run, m)
			}
			m.wire = append(m.wire, q.Chunk)
		}
		for _, id := range out.Admitted {
			m := byID[id]
			if m.state != rWaiting {
				return fail("move %d admitted in state %d", id, m.state)
			}
			if err := admitted(m); err != nil {
				return err
			}
		}
		return nil
	}
	check := func() error {
		if s := b.Stalled(); s != "" {
			return fail("stalled: %s", s)
		}
		var node int64
		for _, p := range peers {
			in := b.InFlight(p)
			if in < 0 {
				return fail("%s: %d in flight", p, in)
			}
			for _, lim := range []int64{perPeer, window} {
				if lim > 0 && in > max(lim, maxChunk) {
					return fail("%s: %d in flight past bound %d", p, in, lim)
				}
			}
			node += in
		}
		if perNode > 0 && node > max(perNode, maxChunk) {
			return fail("node: %d in flight past bound %d", node, perNode)
		}
		return nil
	}
	end := func(m *rmove) error {
		m.state = rEnded
		return apply(b.End(m.id))
	}

	steps := 20 + rng.IntN(120)
	for i := 0; ; i++ {
		draining := i >= steps
		var acts []func() error
		if !draining {
			acts = append(acts, func() error { // a new move
				m := &rmove{id: uint64(len(moves) + 1), peer: peers[rng.IntN(len(peers))], got: map[uint32]bool{}}
				for j, n := 0, 1+rng.IntN(4); j < n; j++ {
					size := 1 + rng.Int64N(150)
					maxChunk = max(maxChunk, size)
					m.payload = append(m.payload, envelope.Chunk{Index: uint32(j), Data: make([]byte, size)})
				}
				moves = append(moves, m)
				byID[m.id] = m
				trace = append(trace, fmt.Sprintf("admit %d→%s", m.id, m.peer))
				if !b.Admit(m.peer, m.id) {
					m.state = rWaiting
					return nil
				}
				return admitted(m)
			})
		}
		for _, m := range moves {
			if m.state == rSealing {
				acts = append(acts, func() error { // sealed and captured: its chunks
					trace = append(trace, fmt.Sprintf("submit %d", m.id))
					return apply(submit(m))
				})
			}
			if len(m.wire) > 0 {
				acts = append(acts, func() error { // the next chunk arrives
					c := m.wire[0]
					m.wire = m.wire[1:]
					if m.state == rEnded || len(m.got) == len(m.payload) {
						return nil
					}
					m.received += uint64(len(c.Data))
					m.got[c.Index] = true
					if len(m.got) == len(m.payload) {
						m.ready = true
					} else {
						m.credits = append(m.credits, m.received)
					}
					return nil
				})
			}
			if len(m.credits) > 0 {
				acts = append(acts, func() error {
					n := m.credits[0]
					m.credits = m.credits[1:]
					trace = append(trace, fmt.Sprintf("credit %d %d", m.id, n))
					return apply(b.Credit(m.id, n))
				})
			}
			if m.ready && m.state == rSending {
				acts = append(acts, func() error {
					trace = append(trace, fmt.Sprintf("return %d", m.id))
					m.state = rReturned
					return apply(b.Return(m.id))
				})
			}
			if m.state == rReturned {
				acts = append(acts, func() error {
					trace = append(trace, fmt.Sprintf("end %d", m.id))
					return end(m)
				})
			}
			if !draining && m.state != rEnded {
				acts = append(acts, func() error { // a failure ends it
					trace = append(trace, fmt.Sprintf("fail %d", m.id))
					return end(m)
				})
			}
		}
		if !draining {
			acts = append(acts, func() error { // a lost connection
				p := peers[rng.IntN(len(peers))]
				trace = append(trace, "lost "+p)
				for _, m := range moves {
					if m.peer != p {
						continue
					}
					m.wire = nil
					if rng.IntN(2) == 0 {
						m.credits = nil // or they arrive late
					}
				}
				out := b.LostPeer(p)
				for _, q := range out.Chunks {
					if byID[q.Run].peer == p {
						return fail("a chunk of move %d to %s goes before its resend", q.Run, p)
					}
				}
				if err := apply(out); err != nil {
					return err
				}
				for _, m := range moves {
					if m.peer == p && m.state == rSending {
						if err := apply(b.Submit(m.peer, m.id, m.payload)); err != nil {
							return err
						}
					}
				}
				return nil
			})
		}
		if len(acts) == 0 {
			break
		}
		if err := acts[rng.IntN(len(acts))](); err != nil {
			return err
		}
		if err := check(); err != nil {
			return err
		}
	}
	for _, m := range moves {
		if m.state != rEnded {
			return fail("move %d never ends (state %d): nothing in flight lets it go", m.id, m.state)
		}
	}
	if !b.Idle() {
		return fail("not idle after every move ended")
	}
	return nil
}
