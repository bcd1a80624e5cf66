package consulstore

import (
	"strings"
	"testing"
)

// Escaped IDs contain no '/', '.', or byte outside [A-Za-z0-9_%-], and
// unescape to the exact bytes. Reference: docs/PROTOCOL.md §7.1 (byte-exact IDs).
func FuzzEscapeRoundTrip(f *testing.F) {
	for _, s := range []string{"a/b", "100%", "..", "emoji 🚀", "%2F", "\x00", "Case"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		esc := escapeID(id)
		for i := 0; i < len(esc); i++ {
			if c := esc[i]; !keep(c) && c != '%' {
				t.Fatalf("escaped %q contains %q", id, c)
			}
		}
		if strings.Contains(esc, "/") || strings.Contains(esc, ".") {
			t.Fatalf("escaped %q = %q", id, esc)
		}
		back, err := unescapeID(esc)
		if err != nil || back != id {
			t.Fatalf("round trip of %q: %q, %v", id, back, err)
		}
	})
}

func TestUnescapeRejectsMalformed(t *testing.T) {
	for _, s := range []string{"%", "%2", "%zz", "a/b", "a.b", "%2f"} {
		if _, err := unescapeID(s); err == nil {
			t.Errorf("unescape %q: want error", s)
		}
	}
}
