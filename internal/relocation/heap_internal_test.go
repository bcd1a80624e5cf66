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
