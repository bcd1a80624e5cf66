package activation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// A Write run on its own (the User Spot paths' commits and reservations)
// decides its outcome the same way, with its own deadline timer, and ends
// with Finish.
// Reference: docs/PROTOCOL.md §3.3, §7.2, §7.5 (an indeterminate outcome is
// settled by a consistent read).
func TestWriteAlone(t *testing.T) {
	rec := record(5, ready, self, nil).Record
	newWrite := func() (*Write, []Effect) {
		w := NewCompareAndSet(cfg, cartKey, 5, rec, deadline).Alone()
		return w, w.Start()
	}

	w, effects := newWrite()
	require.Equal(t, []string{"StartTimer", "CompareAndSet"}, names(effects))
	require.Equal(t, StartTimer{Timer: TimerDeadline, At: deadline}, effects[0])
	step(t, w, WriteAnswered{Version: 6, Now: t0}, "Finish")
	o, v, err := w.Result()
	require.Equal(t, Applied, o)
	require.EqualValues(t, 6, v)
	require.NoError(t, err)

	w, _ = newWrite()
	step(t, w, WriteAnswered{Err: location.ErrConflict, Now: t0}, "Finish")
	o, _, _ = w.Result()
	require.Equal(t, Lost, o)

	w, _ = newWrite()
	step(t, w, WriteAnswered{Err: location.ErrIndeterminate, Now: t0}, "ReadRecord")
	step(t, w, RecordRead{Record: location.Versioned{Key: cartKey, Version: 9, Record: proto.Clone(rec).(*location.Record)}, Now: t0}, "Finish")
	o, v, _ = w.Result()
	require.Equal(t, Applied, o, "the record written is the mark of a compare-and-set")
	require.EqualValues(t, 9, v)

	w, _ = newWrite()
	step(t, w, WriteAnswered{Err: location.ErrIndeterminate, Now: t0}, "ReadRecord")
	step(t, w, RecordRead{Err: errStore, Now: t0}, "StartTimer")
	effects = step(t, w, TimerFired{Timer: TimerDeadline, Now: deadline}, "StopTimer", "Finish")
	o, _, err = w.Result()
	require.Equal(t, WriteFailed, o)
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.Equal(t, err, effects[1].(Finish).Err)

	w, _ = newWrite()
	step(t, w, WriteAnswered{Err: location.ErrLeaseEnded, Now: t0}, "Finish")
	o, _, err = w.Result()
	require.Equal(t, WriteFailed, o)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Contains(t, err.Error(), "commit instance_spot")

	// A Write without a deadline never gives up settling by itself.
	w = NewCompareAndSet(cfg, cartKey, 5, rec, time.Time{}).Alone()
	require.Equal(t, []string{"CompareAndSet"}, names(w.Start()))
	step(t, w, WriteAnswered{Err: location.ErrIndeterminate, Now: t0}, "ReadRecord")
	step(t, w, RecordRead{Err: errStore, Now: at(time.Hour)}, "StartTimer")
}
