package relocation

import (
	"context"
	"time"
)

// SetDeadLetterPatience changes how long the driver keeps redelivering a
// dead-lettered send (30 s), so that a test can go past it quickly.
func (d *Driver) SetDeadLetterPatience(p time.Duration) {
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		d.deadLetterPatience = p
		return struct{}{}, nil
	})
}
