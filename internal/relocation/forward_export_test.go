package relocation

import "time"

// ForwardedPatience is how long d waits for an owner's answer to a
// forwarded operation when the caller's context has no deadline.
func ForwardedPatience(d *Driver) time.Duration { return d.cfg.forwardedPatience() }
