package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// runFeed runs a MoveFeed of (m, rid) on board until the test ends.
func runFeed(t *testing.T, board location.Board, log zerolog.Logger) *MoveFeed {
	f := NewMoveFeed(board, "m", "rid-1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx, log) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func move(id string) relocation.Event {
	return relocation.Event{Key: location.Key(location.KindActor, id), From: "rid-0", To: "rid-1"}
}

// follow collects the seqs of every move the note shows, as roamctl watch
// reads it: each version of the note, from the first.
func follow(t *testing.T, board location.Board) (seen func() map[uint64]bool) {
	var mu sync.Mutex
	got := map[uint64]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var v location.StoreVersion
		for ctx.Err() == nil {
			f, nv, err := WatchFeed(ctx, board, "m", "rid-1", v)
			if err != nil {
				continue
			}
			v = nv
			mu.Lock()
			for _, m := range f.GetMoves() {
				got[m.GetSeq()] = true
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() map[uint64]bool {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

// A node's last 256 moves with 200-character IDs are twice the store's
// limit on a note: the note keeps the newest that fit, and every later
// move still reaches it (before, every write failed TooLarge, silently,
// and the note stayed at its last size that fitted).
func TestMoveFeedStaysWithinTheNoteLimitWithLongIDs(t *testing.T) {
	store := memstore.New()
	f := runFeed(t, store, zerolog.Nop())
	long := func(i int) string { return fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 195)) }
	for i := 1; i <= 300; i++ {
		f.Add(move(long(i)))
	}
	var note *messages.MoveFeed
	testwait.For(t, func() bool {
		var err error
		note, _, err = Feed(context.Background(), store, "m", "rid-1")
		require.NoError(t, err)
		return note.GetSeq() == 300
	}, "the note holds the 300th move")
	n, err := store.ReadNote(context.Background(), location.NoteKey{Mesh: "m", NodeRid: "rid-1", Name: MovesNote})
	require.NoError(t, err)
	require.LessOrEqual(t, len(n.Value), FeedBytes)
	moves := note.GetMoves()
	require.Greater(t, len(moves), 50, "the note keeps as many of the newest moves as fit")
	require.Less(t, len(moves), FeedLength)
	for i, m := range moves {
		require.Equal(t, uint64(300-len(moves)+1+i), m.GetSeq(), "the newest moves, without a hole")
	}
	require.Equal(t, long(300), moves[len(moves)-1].GetId())
	require.Zero(t, f.WriteFailures())

	// Every later move reaches the note, an absurd ID and one that is not
	// UTF-8 included (protojson refuses such a string).
	seen := follow(t, store)
	ids := []string{long(301), strings.Repeat("y", 1<<20), "bad-\xff-utf8", long(304), long(305)}
	for i, id := range ids {
		f.Add(move(id))
		seq := uint64(301 + i)
		testwait.For(t, func() bool { return seen()[seq] }, fmt.Sprintf("move %d reaches the note", seq))
	}
	note, _, err = Feed(context.Background(), store, "m", "rid-1")
	require.NoError(t, err)
	byID := map[uint64]string{}
	for _, m := range note.GetMoves() {
		byID[m.GetSeq()] = m.GetId()
	}
	require.Len(t, byID[302], maxFeedID+len("…"), "an absurd ID is clipped")
	require.Equal(t, "bad-\uFFFD-utf8", byID[303])
	require.Zero(t, f.WriteFailures())
}

// failingBoard fails every note write while down.
type failingBoard struct {
	location.Board
	down   atomic.Bool
	writes atomic.Int64
}

func (b *failingBoard) WriteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion, value []byte) (location.StoreVersion, error) {
	b.writes.Add(1)
	if b.down.Load() {
		return 0, fmt.Errorf("%w: the store is down", location.ErrUnavailable)
	}
	return b.Board.WriteNote(ctx, key, expected, value)
}

// syncBuffer is a log written from the feed's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A failed write is counted every time and logged, rate-limited, with
// what the operator needs to find the note; the feed writes again once
// the store answers.
func TestMoveFeedLogsAndCountsFailedWrites(t *testing.T) {
	board := &failingBoard{Board: memstore.New()}
	board.down.Store(true)
	var logged syncBuffer
	f := runFeed(t, board, zerolog.New(&logged))
	f.Add(move("walker"))
	testwait.For(t, func() bool { return f.WriteFailures() >= 3 }, "the failed writes are counted")
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	require.Len(t, lines, 1, "one line per %v, not one per failure: %s", feedFailuresLogged, logged.String())
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &line))
	require.Equal(t, "moves_note_write_failed", line["event"])
	require.Equal(t, "warn", line["level"])
	require.Equal(t, "m", line["mesh"])
	require.Equal(t, "rid-1", line["node_rid"])
	require.Equal(t, float64(1), line["moves"])
	require.Contains(t, line["error"], "the store is down")

	board.down.Store(false)
	testwait.For(t, func() bool {
		n, _, err := Feed(context.Background(), board, "m", "rid-1")
		return err == nil && n.GetSeq() == 1
	}, "the note is written once the store answers")
}
