package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// The election (Elect) is over every live node, whether it runs a
// director or not: the oldest lifecycle directs if it runs one, and
// otherwise nobody does. So that an operator can tell (roamctl placement,
// web), each running director announces itself in a note of its own
// lifecycle, from its start to its stop; a lifecycle that ends without
// stopping leaves a note that no live node owns, which the next start
// sweeps (location.SweepNotes).

// AnnouncementNote is the name of a lifecycle's director announcement.
const AnnouncementNote = "placement-director"

// AnnouncementKey is the announcement note of the lifecycle (mesh, rid).
func AnnouncementKey(mesh, rid string) location.NoteKey {
	return location.NoteKey{Mesh: mesh, NodeRid: rid, Name: AnnouncementNote}
}

// Announcement is a running director's note: it directs whenever its
// lifecycle is the elected one, unless Paused.
type Announcement struct {
	Rid        string `json:"rid"`
	Generation uint64 `json:"generation"`
	StartedMs  int64  `json:"started_ms"`
	Paused     bool   `json:"paused"`
}

// DecodeAnnouncement reads an announcement note.
func DecodeAnnouncement(b []byte) (Announcement, error) {
	var a Announcement
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("%w: director announcement: %w", roamerr.ErrInvalidOperation, err)
	}
	return a, nil
}

// Runs reports whether a is the live announcement of the lifecycle n: a
// note of a lifecycle before it (the same RID is never reused, but the
// generation is checked all the same) does not count.
func (a Announcement) Runs(n *location.NodeDescriptor) bool {
	return a.Rid == n.GetNodeRid() && a.Generation == n.GetNodeGeneration()
}

// announcer keeps the director's announcement in step with its state,
// from the director's turns only.
type announcer struct {
	version location.StoreVersion
	written *Announcement // nil until written
	started time.Time
}

// announce writes the announcement if it is missing or out of date, on a
// call of its own, then goes on with then. A failure is tried again at
// the next round: the note is advisory.
func (d *Director) announce(then func()) {
	self := d.env.Self()
	want := Announcement{Rid: self.GetNodeRid(), Generation: self.GetNodeGeneration(),
		StartedMs: d.ann.started.UnixMilli(), Paused: d.paused.Load()}
	if d.ann.written != nil && *d.ann.written == want {
		then()
		return
	}
	version := d.ann.version
	d.call(func() func() {
		v, err := d.writeAnnouncement(want, version)
		return func() {
			if err != nil {
				d.log.Debug().Str("event", "director_announcement_failed").Err(err).Msg("the director's announcement was not written; trying again")
			} else {
				d.ann.version, d.ann.written = v, &want
			}
			then()
		}
	})
}

// writeAnnouncement writes want over the note at version, or at the
// version the note has now if that one is gone, and returns the version
// written.
func (d *Director) writeAnnouncement(want Announcement, version location.StoreVersion) (location.StoreVersion, error) {
	b, _ := json.Marshal(want) // plain data: cannot fail
	ctx, cancel := machine.WithTimeout(d.quit, d.clock(), 5*time.Second)
	defer cancel()
	key := AnnouncementKey(d.env.Mesh, want.Rid)
	v, err := d.env.Board.WriteNote(ctx, key, version, b)
	if errors.Is(err, location.ErrConflict) {
		// Written by an earlier director of this lifecycle, or swept:
		// write over it at the version it has now.
		version = 0
		if n, rerr := d.env.Board.ReadNote(ctx, key); rerr == nil {
			version = n.Version
		}
		v, err = d.env.Board.WriteNote(ctx, key, version, b)
	}
	return v, err
}

// withdraw deletes the announcement once the director has stopped (its
// loop done: ann is Stop's to read).
func (d *Director) withdraw() {
	if d.ann.written == nil {
		return
	}
	// After Stop, so not under quit; stopping is bounded in real time
	// (the node's clock may stand still), and the note sweep removes an
	// announcement left behind with its lifecycle.
	ctx, cancel := machine.WithTimeout(context.Background(), machine.Real, 5*time.Second)
	defer cancel()
	_ = d.env.Board.DeleteNote(ctx, AnnouncementKey(d.env.Mesh, d.ann.written.Rid), 0)
}
