package roam

import "github.com/roamactors/roam/internal/meshnode/lease"

// WatchLease tells watch every change of the lease status of r's current
// node lifecycle (a rejoin's next lifecycle is not watched: NodeRid
// tells a test that one ended). For tests that must tell a node starved
// of CPU — fenced by a late renewal — from a defect.
func WatchLease(r *Roam, watch func(valid bool)) error {
	ext, err := r.started()
	if err != nil {
		return err
	}
	ext.Node().OnLeaseChange(func(st lease.Status) { watch(st == lease.Valid) })
	return nil
}
