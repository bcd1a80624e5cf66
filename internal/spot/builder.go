package spot

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// builder is what every fluent Spot call shares (docs/PROTOCOL.md §7.2, §7.4): each
// option may be set once, the call is submitted once, and one timeout and
// an optional Mesh apply to it. Setting an option twice or submitting
// twice is InvalidOperation.
type builder struct {
	set       map[string]bool
	err       error
	submitted atomic.Bool
	timeout   time.Duration
	mesh      string
}

func (b *builder) once(option string) bool {
	if b.set == nil {
		b.set = map[string]bool{}
	}
	if b.set[option] {
		b.err = fmt.Errorf("%w: %s set twice", roamerr.ErrInvalidOperation, option)
		return false
	}
	b.set[option] = true
	return true
}

func (b *builder) inMesh(mesh string) {
	if b.once("InMesh") {
		b.mesh = mesh
	}
}

func (b *builder) withTimeout(d time.Duration) {
	if b.once("Timeout") {
		if d <= 0 {
			b.err = fmt.Errorf("%w: timeout %s", roamerr.ErrInvalidOperation, d)
		}
		b.timeout = d
	}
}

// submit marks the call submitted and returns what makes it invalid: a
// second submit, an option error, or a malformed Mesh name.
func (b *builder) submit(what string) error {
	if b.submitted.Swap(true) {
		return fmt.Errorf("%w: %s submitted twice", roamerr.ErrInvalidOperation, what)
	}
	if b.err != nil {
		return b.err
	}
	if b.mesh != "" {
		if err := location.ValidateID("mesh", b.mesh); err != nil {
			return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
		}
	}
	return nil
}
