package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// A node whose last 256 moves have 200-character IDs (more than a note
// may hold): watch still shows every move it commits later. Before, the
// node's moves note stopped being written once it outgrew the store's
// limit, and watch showed nothing more.
func TestWatchSeesEveryMoveWithLongIDs(t *testing.T) {
	store := manualStore()
	a := claim(t, store, "default", "node-a", 0)
	b := claim(t, store, "default", "node-b", 0)
	feed := operator.NewMoveFeed(store, "default", b.NodeRid, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go feed.Run(ctx, zerolog.Nop())
	id := func(i int) string { return fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 195)) }
	add := func(i int) {
		feed.Add(relocation.Event{Key: location.Key(location.KindActor, id(i)), From: a.NodeRid, To: b.NodeRid})
	}
	for i := 1; i <= 300; i++ {
		add(i)
	}
	testwait.For(t, func() bool {
		f, _, err := operator.Feed(ctx, store, "default", b.NodeRid)
		return err == nil && f.GetSeq() == 300
	}, "node-b's moves note holds its 300 moves so far")

	c, out, errOut := testCtl(store)
	c.json = true
	start := time.Now()
	c.now = func() time.Time { return start }
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, 20) }()
	for i := 301; i <= 320; i++ {
		add(i)
	}
	testwait.For(t, func() bool {
		select {
		case err := <-done:
			require.NoError(t, err)
			return true
		default:
			return false
		}
	}, "watch shows the 20 later moves")
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m moveLine
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		seen[m.ID] = true
	}
	for i := 301; i <= 320; i++ {
		require.True(t, seen[id(i)], "move %d shown", i)
	}
	require.Empty(t, errOut.String())
}
