package operator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// FeedLength is the most moves a node's moves note keeps; FeedBytes
// bounds it too, so with long IDs it keeps fewer.
const FeedLength = 256

// FeedBytes bounds a moves note's encoded size, a quarter under the
// store's limit (location.MaxNoteBytes): a note that does not fit is
// never written, and the feed would go blind on the longest IDs.
const FeedBytes = location.MaxNoteBytes * 3 / 4

// maxFeedID bounds the ID a move record keeps. A valid ID is far
// shorter (location.MaxIDBytes); the bound is for an ID no store check
// saw, so that one record alone can never outgrow FeedBytes.
const maxFeedID = 1024

// feedEvery bounds how often a node rewrites its moves note: a drain of
// thousands of units costs the store a few writes a second, not one a move.
const feedEvery = 250 * time.Millisecond

// feedFailuresLogged bounds the moves_note_write_failed lines: a store
// that is down fails every tick, and one line per interval (with the
// count of the others) says as much.
const feedFailuresLogged = 10 * time.Second

// MoveFeed keeps the last moves a node lifecycle committed as target and
// publishes them in its moves note (roamctl watch).
type MoveFeed struct {
	board location.Board
	key   location.NoteKey
	mu    sync.Mutex
	feed  messages.MoveFeed
	dirty bool

	failures  atomic.Int64
	failedLog ratelog.Limiter
	clock     machine.Clock
}

// NewMoveFeed is the moves note of the node lifecycle (mesh, rid), stamped
// and paced on the node's clock (Real when nil).
func NewMoveFeed(board location.Board, mesh, rid string, clock machine.Clock) *MoveFeed {
	return &MoveFeed{board: board, key: location.NoteKey{Mesh: mesh, NodeRid: rid, Name: MovesNote},
		failedLog: ratelog.Limiter{Every: feedFailuresLogged}, clock: machine.Or(clock)}
}

// WriteFailures is how many writes of the moves note failed so far.
func (f *MoveFeed) WriteFailures() int64 { return f.failures.Load() }

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
		Seq: f.feed.Seq, Kind: e.Key.Kind, Id: feedID(e.Key.ID), FromRid: e.From, ToRid: e.To,
		PauseNanos: int64(e.Pause), Bytes: e.Bytes, AtUnixNanos: f.clock.Now().UnixNano(), Fallback: e.Fallback,
	})
	if over := len(f.feed.Moves) - FeedLength; over > 0 {
		f.feed.Moves = append(f.feed.Moves[:0], f.feed.Moves[over:]...)
	}
	f.dirty = true
}

// feedID is id as a note can hold it: protojson refuses a string that is
// not UTF-8, and one such record would keep the whole note from being
// written.
func feedID(id string) string {
	id = strings.ToValidUTF8(id, "\uFFFD")
	if len(id) <= maxFeedID {
		return id
	}
	return strings.ToValidUTF8(id[:maxFeedID], "") + "…"
}

// encode is the note's value, the oldest moves dropped until it fits in
// limit bytes. Called with f.mu held.
func (f *MoveFeed) encode(limit int) ([]byte, error) {
	for {
		b, err := Encode(&f.feed)
		if err != nil || len(b) <= limit || len(f.feed.Moves) == 0 {
			return b, err
		}
		// Drop about the share of the moves the note is over by (at least
		// one), so a note of many moves fits in a few encodings.
		drop := max(1, len(f.feed.Moves)*(len(b)-limit)/len(b))
		f.feed.Moves = append(f.feed.Moves[:0], f.feed.Moves[min(drop, len(f.feed.Moves)):]...)
	}
}

var feedFailureCounter = sync.OnceValue(func() metric.Int64Counter {
	c, _ := otel.GetMeterProvider().Meter("github.com/roamactors/roam/internal/operator").Int64Counter("roam.operator.moves_note_write_failures",
		metric.WithDescription("writes of a node's moves note (roamctl watch, web) that failed, by error code"))
	return c
})

// Run publishes the feed every feedEvery while it changed, until ctx
// ends. A write that fails is counted, logged (at most once every
// feedFailuresLogged) and tried again at the next tick.
func (f *MoveFeed) Run(ctx context.Context, log zerolog.Logger) {
	var version location.StoreVersion
	limit := FeedBytes
	for {
		if machine.Sleep(ctx, f.clock, feedEvery) != nil {
			return
		}
		f.mu.Lock()
		if !f.dirty {
			f.mu.Unlock()
			continue
		}
		b, err := f.encode(limit)
		moves := len(f.feed.Moves)
		f.dirty = false
		f.mu.Unlock()
		if err != nil {
			f.failed(ctx, &log, err, len(b), moves)
			continue
		}
		v, err := f.board.WriteNote(ctx, f.key, version, b)
		switch {
		case err == nil:
			version = v
			limit = FeedBytes
		case ctx.Err() != nil:
			return
		case errors.Is(err, location.ErrConflict):
			// Written by someone else (or deleted by a sweep): take its
			// version and write again next tick.
			if n, rerr := f.board.ReadNote(ctx, f.key); rerr == nil {
				version = n.Version
			} else {
				version = 0
			}
			f.redo()
		default:
			f.failed(ctx, &log, err, len(b), moves)
			if errors.Is(err, location.ErrTooLarge) {
				// A store with a lower limit than location.MaxNoteBytes:
				// the same note would fail again; a smaller one may not.
				limit = max(limit/2, 1024)
			}
			f.redo()
		}
	}
}

func (f *MoveFeed) redo() {
	f.mu.Lock()
	f.dirty = true
	f.mu.Unlock()
}

func (f *MoveFeed) failed(ctx context.Context, log *zerolog.Logger, err error, size, moves int) {
	f.failures.Add(1)
	if c := feedFailureCounter(); c != nil {
		c.Add(ctx, 1, metric.WithAttributes(attribute.String("code", roamerr.Code(err))))
	}
	f.failedLog.Warn(log).Str("event", "moves_note_write_failed").Str("mesh", f.key.Mesh).Str("node_rid", f.key.NodeRid).
		Int("bytes", size).Int("moves", moves).Int64("failures", f.failures.Load()).Err(err).
		Msg("the moves note (roamctl watch, web) could not be written; trying again")
}
