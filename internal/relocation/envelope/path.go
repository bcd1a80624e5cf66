package envelope

import "strconv"

// seg is one step of a field path: a field name, or a field name with an
// element index when idx >= 0 ("savedWork[1]").
type seg struct {
	name string
	idx  int
}

// fieldPath is a stack of path segments; it is joined into a string such
// as "savedWork[1].record.metadata.count" only when a path is reported.
type fieldPath []seg

func (p *fieldPath) push(name string, idx int) { *p = append(*p, seg{name: name, idx: idx}) }
func (p *fieldPath) pop()                      { *p = (*p)[:len(*p)-1] }

func (p fieldPath) join(leaf string) string {
	var b []byte
	for _, s := range p {
		b = append(b, s.name...)
		if s.idx >= 0 {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(s.idx), 10)
			b = append(b, ']')
		}
		b = append(b, '.')
	}
	return string(append(b, leaf...))
}
