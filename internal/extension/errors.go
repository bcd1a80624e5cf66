package extension

import "fmt"

// startFailed is Start's error when a step after the node's start failed
// with err: err's class alone, since a failure to stop the half-started
// node (stopErr) may be of another class; its text is kept.
func startFailed(err, stopErr error) error {
	if stopErr == nil {
		return err
	}
	return fmt.Errorf("%w (and stopping the node failed: %v)", err, stopErr)
}
