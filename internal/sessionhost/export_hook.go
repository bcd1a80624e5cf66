package sessionhost

// Unwrap is the Session a public *roam.Session wraps; package roam sets
// it, for this package's tests that drive Sessions through roam's API.
var Unwrap func(public any) *Session
