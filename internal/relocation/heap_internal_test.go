package relocation

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestAnIdleObjectStaysInItsSizeClass: every idle Spot holds an object
// and, when its kind checkpoints, a cpState. Each fills a size class of
// Go's allocator (192 and 64 bytes): one field more costs every idle Spot
// 16 bytes or more. What few objects need goes in objectRare, or in a map
// of the driver's (Driver.settling).
func TestAnIdleObjectStaysInItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(object{}), uintptr(192), "object")
	require.LessOrEqual(t, unsafe.Sizeof(cpState{}), uintptr(64), "cpState")
}

// The driver's live incarnations: a stopped one's place is taken again,
// and each is there once however often it is added or removed.
func TestLiveIncarnationsReuseTheirPlaces(t *testing.T) {
	d := &Driver{}
	a, b, c := &object{}, &object{}, &object{}
	d.addLive(a)
	d.addLive(b)
	d.addLive(a) // once
	require.ElementsMatch(t, []*object{a, b}, d.liveObjects())
	d.removeLive(a)
	d.removeLive(a) // once
	require.Equal(t, []*object{b}, d.liveObjects())
	d.addLive(c)
	require.Len(t, d.live, 2, "c takes the place a left")
	require.ElementsMatch(t, []*object{b, c}, d.liveObjects())
	d.removeLive(b)
	d.removeLive(c)
	require.Empty(t, d.liveObjects())
	d.addLive(a)
	require.Equal(t, []*object{a}, d.liveObjects())
	require.Len(t, d.live, 2)
}
