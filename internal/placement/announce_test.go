package placement

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// A running director announces itself in its lifecycle's note, paused or
// not, and takes the note back when it stops: what roamctl reads to show
// a director only where one runs.
func TestDirectorAnnouncesItselfWhileItRuns(t *testing.T) {
	store, nodes := storm(t, 0)
	self := nodes[1]
	d, err := New(Config{Enabled: true, Period: 10 * time.Millisecond}, Env{Store: store, Board: store, Mesh: "m",
		Self: func() *location.NodeDescriptor { return self }, Logger: zerolog.Nop()})
	require.NoError(t, err)
	key := AnnouncementKey("m", self.NodeRid)
	read := func() (Announcement, bool) {
		n, err := store.ReadNote(context.Background(), key)
		if err != nil {
			return Announcement{}, false
		}
		a, err := DecodeAnnouncement(n.Value)
		require.NoError(t, err)
		return a, true
	}
	_, found := read()
	require.False(t, found, "no announcement before the director starts")

	d.Start()
	testwait.For(t, func() bool { a, ok := read(); return ok && a.Runs(self) && !a.Paused }, "the director announces itself")
	require.False(t, func() bool { a, _ := read(); return a.Runs(nodes[0]) }(), "the announcement is its own lifecycle's")
	d.Pause()
	testwait.For(t, func() bool { a, ok := read(); return ok && a.Paused }, "the announcement says it is paused")
	d.Resume()
	testwait.For(t, func() bool { a, ok := read(); return ok && !a.Paused }, "and that it runs again")
	d.Stop()
	_, found = read()
	require.False(t, found, "a stopped director takes its announcement back")
}
