package consulstore

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/roamactors/roam/location"
)

// Key layout under the configured prefix:
//
//	<prefix>/loc/<kind>/<escaped id>        a LocationRecord
//	<prefix>/node/<escaped mesh>/<escaped rid>  a NodeDescriptor
//	<prefix>/name/<escaped mesh>/<escaped name> the RID of the live node named so
//	<prefix>/root/<escaped key>             a root's manifest (roots.go)
//	<prefix>/root/<escaped key>/part/<sha256 hex>/<n>  its parts
//	<prefix>/note/<escaped mesh>/<escaped rid>/<name>  a note (board.go)
//	<prefix>/slots/<escaped mesh>/<escaped rid>/<index> a capacity slot (slots.go)
//
// Notes are operator requests and a node's progress on them: advisory,
// never ownership, which only the records under loc/ decide.
//
// IDs are arbitrary UTF-8 (docs/PROTOCOL.md §7.1), so they are escaped to a form that
// survives Consul's HTTP paths byte-exactly: ASCII letters, digits, '-' and
// '_' stay; every other byte becomes %XX (upper-case hex). '/' and '.' are
// escaped too, so an ID can never add a path segment or be "." or "..".

const hexDigits = "0123456789ABCDEF"

func keep(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func escapeID(id string) string {
	var b strings.Builder
	b.Grow(len(id))
	for i := 0; i < len(id); i++ {
		c := id[i]
		if keep(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

func unescapeID(s string) (string, error) {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if !keep(c) {
				return "", fmt.Errorf("unescaped byte %q in key segment %q", c, s)
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated escape in key segment %q", s)
		}
		hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("bad escape in key segment %q", s)
		}
		b = append(b, byte(hi<<4|lo))
		i += 2
	}
	return string(b), nil
}

func (s *Store) kindPrefix(k location.Kind) string {
	return s.prefix + "/loc/" + location.KindName(k) + "/"
}

func (s *Store) recordKey(k location.AuthorityKey) string {
	return s.kindPrefix(k.Kind) + escapeID(k.ID)
}

func (s *Store) nodePrefix(mesh string) string {
	if mesh == "" {
		return s.prefix + "/node/"
	}
	return s.prefix + "/node/" + escapeID(mesh) + "/"
}

func (s *Store) nodeKey(k location.NodeKey) string { return s.nodePrefix(k.Mesh) + escapeID(k.NodeRid) }

// revokedKey marks a lifecycle whose lease another node revoked
// (RevokeLease); ReadNode answers ErrLeaseRevoked for it. A few bytes per
// revoked lifecycle, left in place.
func (s *Store) revokedKey(k location.NodeKey) string {
	return s.prefix + "/revoked/" + escapeID(k.Mesh) + "/" + escapeID(k.NodeRid)
}

// nameKey holds a node name for the live node that claimed it.
func (s *Store) nameKey(mesh, name string) string {
	return s.prefix + "/name/" + escapeID(mesh) + "/" + escapeID(name)
}

// slotPrefix is the prefix of the capacity slots of node: the trailing '/'
// keeps one RID's slots apart from those of a RID it is a prefix of.
func (s *Store) slotPrefix(node location.NodeKey) string {
	return s.prefix + "/slots/" + escapeID(node.Mesh) + "/" + escapeID(node.NodeRid) + "/"
}

// slotKey holds slot index of node, its index in decimal.
func (s *Store) slotKey(node location.NodeKey, index uint32) string {
	return s.slotPrefix(node) + strconv.FormatUint(uint64(index), 10)
}
