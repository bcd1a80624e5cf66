package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/location"
)

// placementJSON is one mesh of `placement --json`.
type placementJSON struct {
	Mesh string `json:"mesh"`
	// Director is the name of the node that directs: the elected one,
	// when it runs a director; "" when none runs.
	Director string `json:"director"`
	// DirectorPaused: the director runs, paused (it plans no moves).
	DirectorPaused bool `json:"director_paused,omitempty"`
	// Elected is the node the election picks (the oldest live lifecycle),
	// whether it runs a director or not; "" with no live node.
	Elected  string                    `json:"elected"`
	InFlight []placement.Attempt       `json:"in_flight"`
	Recent   map[placement.Outcome]int `json:"recent"` // the ledger's last outcomes, by outcome
	Cooling  int                       `json:"cooling"`
	Ledger   bool                      `json:"ledger"` // a ledger note exists
}

// Placement prints, per mesh, the placement director (docs/PLACEMENT.md):
// the elected node, the attempts in flight in its ledger and the ledger's
// recent attempts by outcome.
func (c *ctl) Placement(ctx context.Context) error {
	ctx, cancel := c.readCtx(ctx)
	defer cancel()
	dir, err := c.directory(ctx, c.mesh)
	if err != nil {
		return err
	}
	out, err := c.placementOf(ctx, dir)
	if err != nil {
		return err
	}
	if c.json {
		if err := writeJSON(c.out, map[string]any{"placement": out}); err != nil || len(dir.nodes) > 0 {
			return err
		}
	}
	if len(dir.nodes) == 0 {
		return c.noLiveNodes(ctx)
	}
	names := map[string]string{}
	for _, n := range dir.nodes {
		names[n.Node.GetNodeRid()] = nodeName(n.Node)
	}
	rows := [][]string{{"MESH", "DIRECTOR", "IN FLIGHT", "RECENT COMMITTED", "BUSY", "DEFERRED", "STALE", "COOLING"}}
	for _, p := range out {
		director := p.Director
		switch {
		case director == "":
			director = "-"
		case p.DirectorPaused:
			director += " (paused)"
		}
		rows = append(rows, []string{p.Mesh, director, strconv.Itoa(len(p.InFlight)),
			strconv.Itoa(p.Recent[placement.Committed]), strconv.Itoa(p.Recent[placement.Busy]),
			strconv.Itoa(p.Recent[placement.Deferred]), strconv.Itoa(p.Recent[placement.Stale]), strconv.Itoa(p.Cooling)})
	}
	if err := table(c.out, rows); err != nil {
		return err
	}
	for _, p := range out {
		if p.Director == "" && p.Elected != "" {
			fmt.Fprintf(c.out, "%s: no director runs: the elected node, %s (the oldest), runs none (nodes run one with roam.WithPlacement)\n", p.Mesh, p.Elected)
		}
	}
	for _, p := range out {
		slices.SortFunc(p.InFlight, func(a, b placement.Attempt) int { return int(a.DeadlineMs - b.DeadlineMs) })
		for _, a := range p.InFlight {
			left := time.Duration(a.DeadlineMs-c.now().UnixMilli()) * time.Millisecond
			fmt.Fprintf(c.out, "%s: %s %s -> %s (operation %s, %s left)\n", p.Mesh, a.Key, nameOr(names, a.SourceRid), nameOr(names, a.TargetRid), short(a.Op), left.Round(time.Millisecond))
		}
	}
	return nil
}

// placementOf reads, for each mesh of dir (and c.mesh), the elected node,
// whether it runs a director, and the ledger.
func (c *ctl) placementOf(ctx context.Context, dir *directory) ([]placementJSON, error) {
	byMesh := map[string][]placement.Elector{}
	byRid := map[string]*location.NodeDescriptor{}
	for _, n := range dir.nodes {
		byMesh[n.Node.GetMesh()] = append(byMesh[n.Node.GetMesh()], placement.Elector{Rid: n.Node.GetNodeRid(), Generation: n.Node.GetNodeGeneration()})
		byRid[n.Node.GetNodeRid()] = n.Node
	}
	if c.mesh != "" {
		byMesh[c.mesh] = byMesh[c.mesh]
	}
	meshes := make([]string, 0, len(byMesh))
	for m := range byMesh {
		meshes = append(meshes, m)
	}
	sort.Strings(meshes)
	out := []placementJSON{}
	for _, mesh := range meshes {
		p := placementJSON{Mesh: mesh, Recent: map[placement.Outcome]int{}, InFlight: []placement.Attempt{}}
		if rid := placement.Elect(byMesh[mesh]); rid != "" {
			// The elected node directs only if it runs a director: its
			// announcement says so (placement.AnnouncementNote).
			n := byRid[rid]
			p.Elected = nodeName(n)
			note, err := c.board.ReadNote(ctx, placement.AnnouncementKey(mesh, rid))
			switch {
			case errors.Is(err, location.ErrNotFound):
			case err != nil:
				return nil, fmt.Errorf("read the director announcement of %s: %w", p.Elected, err)
			default:
				if a, err := placement.DecodeAnnouncement(note.Value); err == nil && a.Runs(n) {
					p.Director, p.DirectorPaused = p.Elected, a.Paused
				}
			}
		}
		note, err := c.board.ReadNote(ctx, placement.LedgerKey(mesh))
		switch {
		case errors.Is(err, location.ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("read the placement ledger of %s: %w", mesh, err)
		default:
			l, err := placement.Decode(note.Value)
			if err != nil {
				return nil, err
			}
			p.Ledger = true
			now := c.now().UnixMilli()
			for _, a := range l.InFlight {
				if a.DeadlineMs > now {
					p.InFlight = append(p.InFlight, a)
				}
			}
			for _, f := range l.Done {
				p.Recent[f.Outcome]++
			}
			for _, until := range l.Cooling {
				if until > now {
					p.Cooling++
				}
			}
		}
		out = append(out, p)
	}
	return out, nil
}

func nameOr(names map[string]string, rid string) string {
	if n := names[rid]; n != "" {
		return n
	}
	return rid
}
