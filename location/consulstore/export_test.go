package consulstore

// Sent is how many calls s sent and in how many transactions: reads, then
// writes.
func Sent(s *Store) (readCalls, readTxns, writeCalls, writeTxns int64) {
	return s.reads.calls.Load(), s.reads.txns.Load(), s.writes.calls.Load(), s.writes.txns.Load()
}

// Hold makes s's reads (writes false) or writes queue as if maxInFlight
// transactions were on their way; queued reports how many wait, and
// release sends them.
func Hold(s *Store, writes bool) (queued func() int, release func()) {
	b := &s.reads
	if writes {
		b = &s.writes
	}
	b.mu.Lock()
	b.inFlight = maxInFlight
	b.mu.Unlock()
	queued = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	release = func() {
		for i := 0; i < maxInFlight; i++ {
			go b.run()
		}
	}
	return queued, release
}
