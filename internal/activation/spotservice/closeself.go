package spotservice

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// CloseEnv is what an Instance Spot's own close needs of its host, which
// holds the Spot ID's lock for it. Each primitive with a done answers by
// calling it exactly once, at once or later.
type CloseEnv interface {
	// Read reads the record, under the close's deadline.
	Read(done func(location.Versioned, error))
	// WriteClosing writes closing over the record at version (a Write
	// machine alone, under the close's deadline) and answers how it
	// ended: its outcome, the version written, and the error of a write
	// that failed or whose outcome is unknown.
	WriteClosing(version location.StoreVersion, closing *location.Record, done func(activation.Outcome, location.StoreVersion, error))
	// SettleRead reads the record again, past the close's deadline: the
	// settling has a bound of its own.
	SettleRead(done func(location.Versioned, error))
	// Fence writes ready over itself at version, within the settling's
	// bound.
	Fence(version location.StoreVersion, ready *location.Record, done func(error))
	// Pace calls again after a pause of CloseSettlePace, or reports
	// false once the settling's bound (CloseSettleFor from its first
	// re-read) has passed.
	Pace(again func()) bool
	// Unsettled: the settling gave up; err is its last failure, if any.
	// The record may be Closing while the incarnation serves: the host
	// says so loudly.
	Unsettled(err error)
	// Release runs the Release machine after the Closing write landed at
	// closingAt over ready.
	Release(closingAt location.StoreVersion, ready *location.Record, done func(error))
	// Done: the close ended, nil once released.
	Done(err error)
}

// CloseSelf runs an Instance Spot's own close (docs/PROTOCOL.md §7.9)
// after its handler's turn, on env: the Closing write on the incarnation
// gen of owner being closed, read again when the record changed under
// it for a reason that keeps the incarnation (its recovery pointer
// going); a write whose outcome stays unknown is settled by re-reading,
// never by the timeout; then the Release machine.
func CloseSelf(env CloseEnv, key location.AuthorityKey, gen uint64, owner *messages.Owner) {
	c := &closeRun{env: env, key: key, gen: gen, owner: owner}
	c.attempt()
}

type closeRun struct {
	env   CloseEnv
	key   location.AuthorityKey
	gen   uint64
	owner *messages.Owner
}

func (c *closeRun) attempt() {
	c.env.Read(func(v location.Versioned, err error) {
		if err != nil {
			c.env.Done(activation.StoreError("read "+c.key.String(), err))
			return
		}
		closing := Closing(v.Record, c.gen, c.owner)
		if closing == nil {
			c.env.Done(fmt.Errorf("%w: %s is not Ready here at generation %d", roamerr.ErrStale, c.key, c.gen))
			return
		}
		ready := v.Record
		c.env.WriteClosing(v.Version, closing, func(outcome activation.Outcome, cv location.StoreVersion, err error) {
			switch {
			case outcome == activation.Applied:
				c.release(cv, ready)
			case outcome == activation.Lost:
				c.attempt()
			case errors.Is(err, roamerr.ErrDeadlineExceeded):
				// The outcome is unknown: the write may have landed while
				// this incarnation serves on.
				c.settle(v.Version, ready, err)
			default:
				c.env.Done(err)
			}
		})
	})
}

// settle decides the Closing write expected at version; writeErr is the
// close's error if the write turns out not to have landed.
func (c *closeRun) settle(version location.StoreVersion, ready *location.Record, writeErr error) {
	retry := func(err error) {
		if !c.env.Pace(func() { c.settle(version, ready, writeErr) }) {
			c.env.Unsettled(err)
			c.env.Done(activation.StoreError("settle the Closing write of "+c.key.String(), err))
		}
	}
	c.env.SettleRead(func(v location.Versioned, err error) {
		if err != nil {
			retry(err)
			return
		}
		switch SettleClosing(v, version, c.gen, c.owner) {
		case SettleChanged:
			c.env.Done(fmt.Errorf("%w: %s changed while its Closing write was unsettled", roamerr.ErrStale, c.key))
		case SettleLanded:
			c.release(v.Version, ready)
		case SettleFence:
			c.env.Fence(version, ready, func(err error) {
				if err != nil {
					retry(err)
					return
				}
				c.env.Done(writeErr) // fenced: the Closing write cannot land any more
			})
		case SettleMovedPast:
			c.env.Done(writeErr)
		case SettleRetry:
			retry(nil)
		}
	})
}

func (c *closeRun) release(closingAt location.StoreVersion, ready *location.Record) {
	c.env.Release(closingAt, ready, c.env.Done)
}

// An own close settles a Closing write of unknown outcome for at most
// CloseSettleFor from its first re-read, reading again every
// CloseSettlePace: a close must neither give up on a write that may still
// land nor hold the Spot ID's lock for long.
const (
	CloseSettleFor  = 30 * time.Second
	CloseSettlePace = 50 * time.Millisecond
)
