package chunklink

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/roamactors/roam/messages"
)

// fuzzMaxData keeps the fuzzer's allocations small.
const fuzzMaxData = 1 << 10

func seedFrames(f *testing.F) {
	id := ident(1)
	one := validFrame(f, chunk(id, 0, 0, []byte("a")), 64)
	two := append(validFrame(f, chunk(id, 0, 0, pattern(32, 1)), 64), validFrame(f, chunk(id, 1, 32, pattern(32, 2)), 64)...)
	f.Add(one)
	f.Add(two)
	f.Add(validFrame(f, chunk(id, 0, 0, pattern(fuzzMaxData, 3)), 1<<20))
	f.Add(append(validFrame(f, chunk(ident(2), 0, 0, pattern(100, 4)), 200), validFrame(f, chunk(id, 0, 0, pattern(64, 5)), 64)...))
	f.Add(one[:len(one)-1])                                                            // data cut short
	f.Add(frameBytes(header(f, &messages.RelocationState{Index: 1}), 1, 1, []byte{1})) // no identity
	f.Add(frameBytes(header(f, chunk(id, 0, 0, []byte("d"))), 1, 1, []byte{1}))        // data in the header
	f.Add(frameBytes([]byte{0x0a, 0x7f}, 1, 1, []byte{1}))                             // not a protobuf
	f.Add(frameBytes(header(f, chunk(id, 0, 0, nil)), 0, 1, nil))                      // no data
	f.Add(frameBytes(header(f, chunk(id, 0, 0, nil)), fuzzMaxData+1, 1, nil))          // over the limit
	f.Add(binary.BigEndian.AppendUint32(nil, MaxHeaderBytes+1))
	f.Add([]byte{})
}

// readFrame never panics, and a frame it returns is one the wire format
// allows: an identity, 1..maxData bytes of data that are the frame's last
// bytes, nothing read past the frame.
func FuzzReadFrame(f *testing.F) {
	seedFrames(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		src := bytes.NewReader(b)
		r := bufio.NewReader(src)
		consumed := func() int { return len(b) - src.Len() - r.Buffered() }
		for range 64 {
			start := consumed()
			m, whole, err := readFrame(r, fuzzMaxData, nil)
			if err != nil {
				if m != nil || whole != nil {
					t.Fatalf("an error (%v) with a frame", err)
				}
				return
			}
			if whole != nil {
				t.Fatal("a whole buffer without place")
			}
			n := len(m.GetData())
			if n == 0 || n > fuzzMaxData {
				t.Fatalf("a chunk of %d bytes (limit %d)", n, fuzzMaxData)
			}
			if m.GetIdentity() == nil {
				t.Fatal("a chunk without identity")
			}
			end := consumed()
			hl := int(binary.BigEndian.Uint32(b[start:]))
			if end-start != 4+hl+12+n {
				t.Fatalf("read %d bytes for a frame of %d", end-start, 4+hl+12+n)
			}
			if dl := binary.BigEndian.Uint32(b[start+4+hl:]); int(dl) != n {
				t.Fatalf("declared %d bytes, got %d", dl, n)
			}
			if !bytes.Equal(m.GetData(), b[end-n:end]) {
				t.Fatal("the data is not the frame's last bytes")
			}
		}
	})
}

// Read through a connection's filling, only an expected move's chunks
// come in place, at their offset in a buffer of the expected length; the
// bytes of a delivered chunk are never written again; the bytes counted
// in place stay within MaxInPlace and are all given back at the end.
func FuzzReadFrameInPlace(f *testing.F) {
	seedFrames(f)
	const from = "127.0.0.1:1"
	f.Fuzz(func(t *testing.T, b []byte) {
		// A closed link: expecting answers at once, without waiting.
		l := &Link{cfg: Config{MaxInPlace: 256}, expected: map[expectKey]uint64{}, expectedNow: make(chan struct{}), closed: true}
		l.expected[expectKey{from, identityKey(ident(1))}] = 64
		l.expected[expectKey{from, identityKey(ident(2))}] = 200
		l.expected[expectKey{from, identityKey(ident(3))}] = 300 // over MaxInPlace
		fl := filling{link: l, from: from}
		type delivered struct {
			data, copy []byte
		}
		var got []delivered
		r := bufio.NewReader(bytes.NewReader(b))
		for range 64 {
			m, whole, err := readFrame(r, fuzzMaxData, fl.place)
			if l.inPlace < 0 || l.inPlace > l.cfg.MaxInPlace {
				t.Fatalf("%d bytes counted in place (limit %d)", l.inPlace, l.cfg.MaxInPlace)
			}
			if err != nil {
				break
			}
			if whole != nil {
				want, ok := l.expected[expectKey{from, identityKey(m.GetIdentity())}]
				if !ok || uint64(len(whole)) != want {
					t.Fatalf("a chunk in place in %d bytes: expected %v, %d", len(whole), ok, want)
				}
				if !aliases(delivery{m: m, whole: whole}) {
					t.Fatal("a chunk in place not at its offset")
				}
			}
			got = append(got, delivered{m.GetData(), bytes.Clone(m.GetData())})
		}
		fl.release()
		if l.inPlace != 0 {
			t.Fatalf("%d bytes still counted in place", l.inPlace)
		}
		for i, d := range got {
			if !bytes.Equal(d.data, d.copy) {
				t.Fatalf("chunk %d was written again after it was delivered", i)
			}
		}
	})
}
