package envelope

// Span is one primitive as the encoder wrote it, for the golden .md files.
type Span struct {
	Offset, Length int
	Path, Value    string
}

// EncodeTrace is Encode that also reports every primitive it writes.
func EncodeTrace(e *Envelope) ([]byte, []Span, error) {
	var spans []Span
	b, err := encode(e, func(s span) {
		spans = append(spans, Span{Offset: s.offset, Length: s.length, Path: s.path, Value: s.value})
	})
	return b, spans, err
}

// EncodeUnchecked writes e without validating it, so tests can hand Decode
// the bytes of an envelope Encode refuses. Only meaningful when every text
// and vector fits its length prefix.
func EncodeUnchecked(e *Envelope) []byte {
	var w writer
	w.envelope(e)
	return w.buf
}
