package envelope_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
)

// Decode never panics on any input, and whatever it accepts is canonical:
// Encode of the result reproduces the input byte for byte.
// Reference: docs/PROTOCOL.md §5.6, §10 (bad input changes nothing)
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"minimal.bin", "full.bin"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(stream(okHead(), []wire{state(1, "a")}, []wire{work(1, 1, okRecord())}, []wire{timer(1, "a", "h")}, []wire{tick(1, 1, "a")})))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := envelope.Decode(b)
		if err != nil {
			require.ErrorIs(t, err, envelope.ErrMalformed)
			require.Nil(t, e)
			return
		}
		again, err := envelope.Encode(e)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}
