package mailbox

// ring is a growable FIFO ring buffer that also supports pushing a slice at
// the front (Unseal, OpenWith) and removing everything at once (Seal,
// Redirect, Discard). It is not synchronized: Mailbox.user is used under
// Mailbox.mu, Mailbox.out only by the run goroutine.
//
// Capacity is always zero or a power of two, so index arithmetic is a mask.
// Push and pop are amortized O(1) and allocate nothing once the buffer has
// grown to the working-set size; the buffer only grows (as Proto.Actor's
// goring queue does), except that drain releases a large buffer.
type ring struct {
	buf  []any
	head int32 // index of the first element
	n    int32 // number of elements (int32: the ring is in every idle object)
}

const (
	// ringMinCap is small: most objects hold one message at a time. An
	// idle mailbox drops a buffer this small (dropSmall).
	ringMinCap = 4
	// ringKeepCap: drain keeps a buffer up to this capacity for reuse and
	// releases a larger one, so a relocated-away actor does not pin memory.
	ringKeepCap = 1024
)

func (r *ring) len() int { return int(r.n) }

// grow makes room for at least need elements, keeping their order.
func (r *ring) grow(need int) {
	c := len(r.buf)
	if need <= c {
		return
	}
	if c == 0 {
		c = ringMinCap
	}
	for c < need {
		c <<= 1
	}
	nb := make([]any, c)
	r.copyOut(nb)
	r.buf = nb
	r.head = 0
}

// copyOut copies the elements in order into dst (len(dst) >= r.n).
func (r *ring) copyOut(dst []any) {
	if r.n == 0 {
		return
	}
	mask := len(r.buf) - 1
	first := int(r.head)
	end := first + int(r.n)
	if end <= len(r.buf) {
		copy(dst, r.buf[first:end])
		return
	}
	k := copy(dst, r.buf[first:])
	copy(dst[k:], r.buf[:end&mask])
}

func (r *ring) pushBack(v any) {
	if int(r.n) == len(r.buf) {
		r.grow(int(r.n) + 1)
	}
	r.buf[int(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

func (r *ring) popFront() (any, bool) {
	if r.n == 0 {
		return nil, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = nil // release for GC
	r.head = (r.head + 1) & int32(len(r.buf)-1)
	r.n--
	return v, true
}

// pushFront puts vs ahead of the current elements, keeping vs's order.
func (r *ring) pushFront(vs []any) {
	k := len(vs)
	if k == 0 {
		return
	}
	r.grow(int(r.n) + k)
	mask := len(r.buf) - 1
	head := (int(r.head) - k) & mask
	for i, v := range vs {
		r.buf[(head+i)&mask] = v
	}
	r.head = int32(head)
	r.n += int32(k)
}

// drain removes and returns every element in order (nil when empty).
func (r *ring) drain() []any {
	if r.n == 0 {
		return nil
	}
	return r.appendTo(make([]any, 0, int(r.n)))
}

// appendTo removes every element, appending them in order to dst.
func (r *ring) appendTo(dst []any) []any {
	if r.n == 0 {
		return dst
	}
	k := len(dst)
	dst = append(dst, make([]any, int(r.n))...)
	r.copyOut(dst[k:])
	if len(r.buf) > ringKeepCap {
		r.buf = nil
	} else {
		clear(r.buf)
	}
	r.head, r.n = 0, 0
	return dst
}

// dropSmall drops the buffer of an empty ring if it is the smallest one
// grow makes; a larger one is kept for the burst that needed it.
func (r *ring) dropSmall() {
	if r.n == 0 && len(r.buf) <= ringMinCap {
		r.buf = nil
		r.head = 0
	}
}

// release drops a large buffer once the ring is empty.
func (r *ring) release() {
	if r.n == 0 && len(r.buf) > ringKeepCap {
		r.buf = nil
		r.head = 0
	}
}
