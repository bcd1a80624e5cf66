package spotservice

import "github.com/roamactors/roam/location"

// ScanEnv is what the start-up scan needs from its host. Each callback is
// called at most once: a host whose lifecycle is gone may drop the scan
// by never answering.
type ScanEnv interface {
	// List lists one page of one kind's authority records.
	List(kind location.Kind, page location.PageRequest, done func(location.Page, error))
	// Recover runs the recovery machine for one scanned record.
	Recover(v location.Versioned, done func(error))
}

// RunScan is the start-up scan (Manager.Recover): every page Scan asks
// for, and of each page every record to recover, one recovery after the
// other in the listing's order. A failed listing ends it (listErr); a
// failed recovery does not, and is reported in failed. The driver answers
// at once, the simulation later: either way the walk runs in a loop, not
// on a growing stack.
func RunScan(env ScanEnv, done func(listErr error, failed []error)) {
	r := &scanRun{env: env, done: done}
	r.advance()
}

type scanRun struct {
	env    ScanEnv
	done   func(error, []error)
	scan   Scan
	todo   []location.Versioned
	failed []error
	// running: advance's loop is on the stack; again: an answer came
	// while it was, so it issues the next call instead of recursing.
	running, again, finished bool
}

func (r *scanRun) advance() {
	if r.running {
		r.again = true
		return
	}
	r.running = true
	for r.again = true; r.again && !r.finished; {
		r.again = false
		r.issue()
	}
	r.running = false
}

func (r *scanRun) issue() {
	if len(r.todo) > 0 {
		v := r.todo[0]
		r.todo = r.todo[1:]
		r.env.Recover(v, func(err error) {
			if err != nil {
				r.failed = append(r.failed, err)
			}
			r.advance()
		})
		return
	}
	kind, req, ok := r.scan.Next()
	if !ok {
		r.finished = true
		r.done(nil, r.failed)
		return
	}
	r.env.List(kind, req, func(p location.Page, err error) {
		if err != nil {
			r.finished = true
			r.done(err, r.failed)
			return
		}
		r.todo = r.scan.Page(p)
		r.advance()
	})
}
