package consulstore

import "time"

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
	for { // once the transactions of earlier calls have ended
		b.mu.Lock()
		if b.inFlight == 0 {
			break
		}
		b.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	b.inFlight = maxInFlight
	b.progress = time.Now().Add(time.Hour) // no call takes the queue as stalled
	b.mu.Unlock()
	queued = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	release = func() {
		b.mu.Lock()
		b.progress = time.Now()
		b.mu.Unlock()
		for i := 0; i < maxInFlight; i++ {
			go b.run()
		}
	}
	return queued, release
}

// Jam takes s's reads' and writes' slots as transactions that never end
// would.
func Jam(s *Store) {
	for _, b := range []*batcher{&s.reads, &s.writes} {
		for {
			b.mu.Lock()
			if b.inFlight == 0 {
				break
			}
			b.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
		b.inFlight = maxInFlight
		b.progress = time.Now()
		b.mu.Unlock()
	}
}
