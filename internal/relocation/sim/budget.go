package sim

import (
	"github.com/roamactors/roam/internal/relocation/budget"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
)

// budgetOut sends the chunks a node's budget lets go and steps the moves
// it admits, as the driver's budgetOut does; a move that ended meanwhile
// is gone from n.sources.
func (n *Node) budgetOut(out budget.Out) {
	run := func(id uint64) *SourceRun {
		for _, r := range n.sources {
			if r.m.Identity().RelocationID == id && !r.dead {
				return r
			}
		}
		return nil
	}
	for _, q := range out.Chunks {
		if r := run(q.Run); r != nil {
			n.send(r.target.idx, &packet{kind: pChunk, id: r.m.Identity(), chunk: q.Chunk})
		}
	}
	if s := n.budget.Stalled(); s != "" {
		n.w.violate("budget-stall", "%s: %s", n.name, s)
	}
	for _, id := range out.Admitted {
		if r := run(id); r != nil {
			n.w.stepSource(r, handoff.Admitted{})
		}
	}
}

// checkBudget: every live node's budget is idle once its moves out have
// ended: nothing in flight, queued or waiting.
func (w *World) checkBudget() {
	for _, n := range w.nodes {
		if n.alive && len(n.sources) == 0 && !n.budget.Idle() {
			w.violate("budget", "%s's in-flight payload budget is not idle after its moves out ended: %s", n.name, n.budget)
		}
	}
}

// drawBudget draws, from the budget stream, the nodes' in-flight payload
// budget: per peer from a quarter of a chunk (ChunkLimit; a payload is
// one to three) to four chunks, half the time a node budget as small,
// and half the time a window of a quarter to two chunks.
func drawBudget(cfg *Config, rng *simkit.Rand) {
	chunk := int64(cfg.Handoff.ChunkLimit)
	cfg.Budget.PerPeer = chunk/4 + rng.Int64N(chunk*4)
	if rng.IntN(2) == 0 {
		cfg.Budget.PerNode = chunk/4 + rng.Int64N(chunk*4)
	}
	if rng.IntN(2) == 0 {
		cfg.Budget.Window = chunk/4 + rng.Int64N(chunk*2)
	}
}

// budgetTraffic schedules, from the budget stream, when the nodes have a
// budget, one or two bursts: a node moves every object it serves at once
// (as a drain does), each to another node, so moves wait for the budget
// of one peer and of the node.
func (w *World) budgetTraffic(rng *simkit.Rand) {
	if !w.cfg.RandomBudget {
		return
	}
	for k := 1 + rng.IntN(2); k > 0; k-- {
		at, src := rng.Dur(0, w.cfg.Horizon*4/5), w.nodes[rng.IntN(w.cfg.Nodes)]
		picks := make([]int, len(w.objs))
		for i := range picks {
			picks[i] = rng.IntN(w.cfg.Nodes - 1)
		}
		w.at(at, "budget-burst", func() {
			if w.over || !src.alive {
				return
			}
			for _, o := range w.objs {
				if inc := src.objects[o.id]; inc != nil && o.spot < 0 && inc.state == sServing {
					w.StartMove(o.id, w.nodes[(src.idx+1+picks[o.id])%w.cfg.Nodes])
				}
			}
		})
	}
}
