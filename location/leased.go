package location

import (
	"context"
	"errors"
)

// LeaseHolder is a node whose writes must carry its owner lease.
type LeaseHolder interface {
	// WriteLease returns the node's descriptor key and live lease, or why
	// it must not write now (ErrLeaseEnded, or ErrFenced — an
	// ErrUnavailable — while its lease is not provably in force).
	WriteLease() (NodeKey, LeaseID, error)
}

// FenceWaiter is a LeaseHolder that can wait for a fence to lift: until
// WriteLease would answer anything but ErrFenced, or ctx ends.
type FenceWaiter interface {
	WaitWritable(ctx context.Context) error
}

// Leased wraps a store so that every write of holder (Apply and
// CompareAndSet) is refused locally while holder may not write (a holder
// that is a FenceWaiter first waits, within the write's context, for a
// fence to lift), and
// otherwise carries holder's lease check in the same transaction: a write
// that reaches the store after the lease ended — however it was delayed —
// changes nothing and fails with ErrLeaseEnded. Reads and the node-claim
// methods pass through.
func Leased(inner Store, holder LeaseHolder) Store { return &leased{Store: inner, holder: holder} }

type leased struct {
	Store
	holder LeaseHolder
}

func (l *leased) Apply(ctx context.Context, ops []Op) ([]StoreVersion, error) {
	node, id, err := l.holder.WriteLease()
	if w, ok := l.holder.(FenceWaiter); ok && errors.Is(err, ErrFenced) && w.WaitWritable(ctx) == nil {
		node, id, err = l.holder.WriteLease()
	}
	if err != nil {
		return nil, err
	}
	withCheck := make([]Op, 0, len(ops)+1)
	withCheck = append(append(withCheck, ops...), CheckLeaseOp(node, id))
	versions, err := l.Store.Apply(ctx, withCheck)
	if err != nil {
		return nil, err
	}
	return versions[:len(ops)], nil
}

func (l *leased) CompareAndSet(ctx context.Context, key AuthorityKey, expected StoreVersion, rec *Record) (StoreVersion, error) {
	return CompareAndSetByApply(ctx, l.Apply, key, expected, rec)
}
