package location

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/roamactors/roam/messages"
)

// fill sets every field of m, recursively, to a value drawn to make the
// JSON form long against the binary one: strings of control characters
// (escaped as \u00XX), the longest enum names, the widest integers,
// repeated fields with several elements.
func fill(r *rand.Rand, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.IsMap() {
			continue
		}
		if fd.IsList() {
			l := m.Mutable(fd).List()
			for range 1 + r.IntN(10) {
				if fd.Kind() == protoreflect.MessageKind {
					if depth > 3 {
						break
					}
					e := l.NewElement()
					fill(r, e.Message(), depth+1)
					l.Append(e)
					continue
				}
				l.Append(scalar(r, fd))
			}
			continue
		}
		if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
			if depth > 3 {
				continue
			}
			fill(r, m.Mutable(fd).Message(), depth+1)
			continue
		}
		m.Set(fd, scalar(r, fd))
	}
}

func scalar(r *rand.Rand, fd protoreflect.FieldDescriptor) protoreflect.Value {
	small := r.IntN(2) == 0 // a one-byte varint costs the most JSON per binary byte
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(strings.Repeat("\x01", r.IntN(400)))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(make([]byte, r.IntN(40)))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		longest := vals.Get(0)
		for i := 0; i < vals.Len(); i++ {
			if len(vals.Get(i).Name()) > len(longest.Name()) {
				longest = vals.Get(i)
			}
		}
		return protoreflect.ValueOfEnum(longest.Number())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if small {
			return protoreflect.ValueOfUint64(1)
		}
		return protoreflect.ValueOfUint64(^uint64(0))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if small {
			return protoreflect.ValueOfInt64(-1)
		}
		return protoreflect.ValueOfInt64(-1 << 63)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(-1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5e-30)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1.5e-300)
	}
	panic("unhandled kind " + fd.Kind().String())
}

// The cheap bound that lets a write skip its JSON encoding is an upper
// bound of the exact encoded size, for records with every field set to
// values that make the JSON long (control characters, longest enum
// names, widest or smallest integers), and for an empty record.
func TestSizeBoundIsAnUpperBound(t *testing.T) {
	require.LessOrEqual(t, EncodedSize(&Record{}), sizeBound(&Record{}))
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 7))
		rec := &Record{}
		fill(r, rec.ProtoReflect(), 0)
		require.LessOrEqual(t, EncodedSize(rec), sizeBound(rec), "seed %d", seed)
	}
}

// PageBytes, what memstore counts a listed record with, is an upper bound
// of the exact encoded size for the same long-JSON records, and no more
// than a fifth over it for a record as roam writes them.
func TestPageBytesIsATightUpperBound(t *testing.T) {
	require.LessOrEqual(t, EncodedSize(&Record{}), PageBytes(&Record{}))
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 7))
		rec := &Record{}
		fill(r, rec.ProtoReflect(), 0)
		require.LessOrEqual(t, EncodedSize(rec), PageBytes(rec), "seed %d", seed)
	}
	typical := &Record{ObjectGeneration: 1733100000123456, AuthorityOwnerGeneration: 3, State: messages.LifecycleState_LIFECYCLE_STATE_READY,
		StableType: "shopping-cart", SpotKind: messages.SpotKind_SPOT_KIND_INSTANCE,
		Owner: &messages.Owner{Mesh: "default", NodeRid: "node-7f3a", NodeGeneration: 1733100000000001, LeaseId: "4e1c-aa"}}
	exact, bound := EncodedSize(typical), PageBytes(typical)
	require.LessOrEqual(t, exact, bound)
	require.LessOrEqual(t, bound, exact*6/5, "exact %d, bound %d", exact, bound)
}
