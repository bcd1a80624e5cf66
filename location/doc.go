// Package location is the Location Store contract: where the owner,
// ObjectGeneration, AuthorityOwnerGeneration, lifecycle state and membership
// of every Spot and Actor live, changed only by compare-and-set
// (docs/PROTOCOL.md §3).
//
// Two implementations obey the same contract and pass the same suite
// (storetest): memstore, embedded in one process, and consulstore, Consul KV
// with check-and-set, transactions and sessions for owner leases. faulty
// wraps either and injects latency, unavailable and indeterminate outcomes.
//
// Every error a Store returns matches one of the sentinels below with
// errors.Is; a lost compare-and-set is a *ConflictError carrying the current
// records.
package location
