package spawn

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var serving = Here{Present: true, Generation: 5, Serving: true}

func with(f func(*Here)) Here {
	h := serving
	f(&h)
	return h
}

// A Close ends only the serving incarnation of the generation it names,
// not while it is moving or being recovered.
func TestAdmitClose(t *testing.T) {
	key := location.Key(location.KindUserSpot, "room")
	for _, c := range []struct {
		name string
		h    Here
		want error
	}{
		{"serving", serving, nil},
		{"being taken over", Here{Pending: true}, roamerr.ErrUnavailable},
		{"nothing here", Here{}, roamerr.ErrNotFound},
		{"another generation", with(func(h *Here) { h.Generation = 6 }), roamerr.ErrNotFound},
		{"moved away", with(func(h *Here) { h.Serving, h.Ended = false, true }), roamerr.ErrNotFound},
		{"staging", with(func(h *Here) { h.Serving = false }), roamerr.ErrUnavailable},
		{"moving out", with(func(h *Here) { h.Moving = true }), roamerr.ErrUnavailable},
		{"a registered incarnation wins over a pending one", with(func(h *Here) { h.Pending = true }), nil},
	} {
		err := AdmitClose(key, 5, c.h)
		if c.want == nil {
			require.NoError(t, err, c.name)
			continue
		}
		require.ErrorIs(t, err, c.want, c.name)
	}
}

// A delete closes the serving incarnation first, deletes the record alone
// where nothing serves it, and is refused while anything else changes it.
func TestAdmitDelete(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	for _, c := range []struct {
		name     string
		h        Here
		stopping bool
		close    bool
		want     error
	}{
		{"serving", serving, false, true, nil},
		{"nothing serves it here", Here{}, false, false, nil},
		{"arriving, taken over or past its cutover", Here{Pending: true}, false, false, roamerr.ErrUnavailable},
		{"the node stops", serving, true, false, roamerr.ErrUnavailable},
		{"the node stops, nothing here", Here{}, true, false, roamerr.ErrUnavailable},
		{"another generation", with(func(h *Here) { h.Generation = 4 }), false, false, roamerr.ErrUnavailable},
		{"not serving", with(func(h *Here) { h.Serving = false }), false, false, roamerr.ErrUnavailable},
		{"moving", with(func(h *Here) { h.Moving = true }), false, false, roamerr.ErrUnavailable},
		{"activating", with(func(h *Here) { h.Activating = true }), false, false, roamerr.ErrUnavailable},
		{"its membership changes", with(func(h *Here) { h.Changing = true }), false, false, roamerr.ErrUnavailable},
	} {
		closeIt, err := AdmitDelete(key, 5, c.h, "n1", c.stopping)
		require.Equal(t, c.close, closeIt, c.name)
		if c.want == nil {
			require.NoError(t, err, c.name)
			continue
		}
		require.ErrorIs(t, err, c.want, c.name)
	}
}

func top(n int) int { return n - 1 }

func at(version location.StoreVersion, o *messages.Owner, gen uint64) location.Versioned {
	return location.Versioned{Key: location.Key(location.KindActor, "a"), Version: version, Record: &location.Record{Owner: o, ObjectGeneration: gen}}
}

var (
	conflict      = &location.ConflictError{Op: "apply"}
	indeterminate = fmt.Errorf("apply: %w", location.ErrIndeterminate)
	down          = fmt.Errorf("apply: %w", location.ErrUnavailable)
)

// One try after another, as the driver feeds them: what the delete does
// next, at which version, and how it ends.
func TestDelete(t *testing.T) {
	other := &messages.Owner{NodeRid: "n2", NodeGeneration: 1, LeaseId: "m"}
	type answer struct {
		wrote error
		// reread, when the write conflicted: the record read again.
		cur   location.Versioned
		found bool
		rerr  error
		step  DeleteStep
		// pause and warn when the step is Retry.
		pause time.Duration
		warn  bool
	}
	for _, c := range []struct {
		name    string
		tries   []answer
		version location.StoreVersion // At once the tries ran
		deleted bool
		err     error
	}{
		{name: "deleted at once", tries: []answer{{step: Deleted}}, version: 3},
		{name: "a Spot's count moved: deleted at the new version", tries: []answer{
			{wrote: conflict, cur: at(4, self, 5), found: true, step: Retry, pause: handoff.RacePause(0, top)},
			{step: Deleted},
		}, version: 4},
		{name: "a store fault, then deleted", tries: []answer{
			{wrote: down, step: Retry, pause: handoff.StorePause(1), warn: true},
			{wrote: down, step: Retry, pause: handoff.StorePause(2), warn: true},
			{step: Deleted},
		}, version: 3},
		{name: "an unknown outcome landed: gone, deleted", tries: []answer{
			{wrote: indeterminate, step: Retry, pause: handoff.StorePause(1), warn: true},
			{wrote: conflict, found: false, step: Over},
		}, version: 3, deleted: true},
		{name: "gone without a try that may have landed: not this delete's", tries: []answer{
			{wrote: down, step: Retry, pause: handoff.StorePause(1), warn: true},
			{wrote: conflict, found: false, step: Over},
		}, version: 3},
		{name: "spawned again after an unknown outcome", tries: []answer{
			{wrote: indeterminate, step: Retry, pause: handoff.StorePause(1), warn: true},
			{wrote: conflict, cur: at(9, self, 6), found: true, step: Over},
		}, version: 3, deleted: true},
		{name: "another owner holds it", tries: []answer{
			{wrote: conflict, cur: at(5, other, 5), found: true, step: Over},
		}, version: 3, err: roamerr.ErrNotFound},
		{name: "the reread fails", tries: []answer{
			{wrote: conflict, rerr: down, step: Retry, pause: handoff.StorePause(1), warn: true},
			{wrote: conflict, cur: at(4, self, 5), found: true, step: Retry, pause: handoff.RacePause(1, top)},
			{step: Deleted},
		}, version: 4},
	} {
		x := &Delete{Key: location.Key(location.KindActor, "a"), Owner: self, At: at(3, self, 5)}
		for try, a := range c.tries {
			step := x.Wrote(a.wrote)
			if step == Reread {
				step = x.Reread(a.cur, a.found, a.rerr)
			}
			require.Equal(t, a.step, step, "%s: try %d", c.name, try)
			if step == Retry {
				pause, warn := x.Pause(try, top)
				require.Equal(t, a.pause, pause, "%s: try %d", c.name, try)
				require.Equal(t, a.warn, warn, "%s: try %d", c.name, try)
			}
		}
		require.Equal(t, c.version, x.At.Version, c.name)
		if c.tries[len(c.tries)-1].step != Over {
			continue
		}
		deleted, err := x.Result()
		require.Equal(t, c.deleted, deleted, c.name)
		if c.err == nil {
			require.NoError(t, err, c.name)
		} else {
			require.ErrorIs(t, err, c.err, c.name)
		}
	}
}

// A node that stops while its delete waits answers Unavailable, naming
// the last failure.
func TestDeleteStopped(t *testing.T) {
	x := &Delete{Key: location.Key(location.KindActor, "a"), Owner: self, At: at(3, self, 5)}
	require.Equal(t, Retry, x.Wrote(down))
	err := x.Stopped("n1")
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Contains(t, err.Error(), down.Error())
	require.Equal(t, down, x.Err())
}
