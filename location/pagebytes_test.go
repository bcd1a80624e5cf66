package location

import (
	"strings"
	"testing"

	"github.com/roamactors/roam/messages"
)

// Strings whose JSON form is longest against their bytes (escaped
// newlines and control characters, U+2028, quotes and backslashes) and an
// enum number with no name stay under PageBytes.
func TestPageBytesBoundsEscapedStrings(t *testing.T) {
	for _, s := range []string{strings.Repeat("\n", 1000), strings.Repeat("\x01", 1000), strings.Repeat("\u2028", 300), strings.Repeat(`"\`, 300), "\x7f\u00e9\U0001F600"} {
		rec := &Record{StableType: s, Owner: &messages.Owner{Mesh: s, NodeRid: s}, State: messages.LifecycleState(-2147483648)}
		if e, b := EncodedSize(rec), PageBytes(rec); e > b {
			t.Errorf("%q: exact %d > bound %d", s[:4], e, b)
		}
	}
}

// A string that is not UTF-8 has no JSON form: PageBytes counts such a
// record as EncodedSize does, over MaxRecordBytes, so memstore's pages are
// cut where a JSON store's would fail.
func TestPageBytesOfARecordWithNoJSONForm(t *testing.T) {
	for _, rec := range []*Record{{StableType: "cart\xff"}, {Owner: &messages.Owner{NodeRid: "n\xc3"}}} {
		if e, b := EncodedSize(rec), PageBytes(rec); e > b || b != MaxRecordBytes+1 {
			t.Errorf("%v: EncodedSize %d, PageBytes %d", rec, e, b)
		}
	}
}
