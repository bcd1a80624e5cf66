package operator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// FeedLength is how many moves a node's moves note keeps.
const FeedLength = 256

// feedEvery bounds how often a node rewrites its moves note: a drain of
// thousands of units costs the store a few writes a second, not one a move.
const feedEvery = 250 * time.Millisecond

// MoveFeed keeps the last moves a node lifecycle committed as target and
// publishes them in its moves note (roamctl watch).
type MoveFeed struct {
	board location.Board
	key   location.NoteKey
	mu    sync.Mutex
	feed  messages.MoveFeed
	dirty bool
}

// NewMoveFeed is the moves note of the node lifecycle (mesh, rid).
func NewMoveFeed(board location.Board, mesh, rid string) *MoveFeed {
	return &MoveFeed{board: board, key: location.NoteKey{Mesh: mesh, NodeRid: rid, Name: MovesNote}}
}

// Add records one finished move (a relocation.Event of this node); a
// failed move is not a move and is left out. Quick: it only appends.
func (f *MoveFeed) Add(e relocation.Event) {
	if e.Err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.feed.Seq++
	f.feed.Moves = append(f.feed.Moves, &messages.MoveRecord{
		Seq: f.feed.Seq, Kind: e.Key.Kind, Id: e.Key.ID, FromRid: e.From, ToRid: e.To,
		PauseNanos: int64(e.Pause), Bytes: e.Bytes, AtUnixNanos: time.Now().UnixNano(), Fallback: e.Fallback,
	})
	if over := len(f.feed.Moves) - FeedLength; over > 0 {
		f.feed.Moves = append(f.feed.Moves[:0], f.feed.Moves[over:]...)
	}
	f.dirty = true
}

// Run publishes the feed every feedEvery while it changed, until ctx ends.
func (f *MoveFeed) Run(ctx context.Context) {
	t := time.NewTicker(feedEvery)
	defer t.Stop()
	var version location.StoreVersion
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.mu.Lock()
		if !f.dirty {
			f.mu.Unlock()
			continue
		}
		b, err := Encode(&f.feed)
		f.dirty = false
		f.mu.Unlock()
		if err != nil {
			continue
		}
		v, err := f.board.WriteNote(ctx, f.key, version, b)
		switch {
		case err == nil:
			version = v
		case errors.Is(err, location.ErrConflict):
			// Written by someone else (or deleted by a sweep): take its
			// version and write again next tick.
			if n, rerr := f.board.ReadNote(ctx, f.key); rerr == nil {
				version = n.Version
			} else {
				version = 0
			}
			f.mu.Lock()
			f.dirty = true
			f.mu.Unlock()
		default:
			f.mu.Lock()
			f.dirty = true
			f.mu.Unlock()
		}
	}
}
