#!/usr/bin/env bash
# Prepares the module file the race-detector run of the multi-node tests
# uses (make test-race-all and test-race-root). It patches eleven races inside Proto.Actor.
#
# Proto.Actor's remote.Start calls grpclog.SetLoggerV2 on every start, which
# writes a gRPC global that the gRPC goroutines of remotes already running
# read: with two or more remotes in one process, the race detector reports
# that race inside Proto.Actor on every multi-node test and hides any race in
# roam's own code. For the race run only, this script copies the Proto.Actor
# module from the module cache, makes that call run once per process (the
# first remote's start, before any gRPC goroutine exists), and writes a
# go.mod/go.sum pair that replaces the module with the copy. roam's builds,
# demo and non-race tests use the module unchanged.
set -euo pipefail
out="$1"
go="${GO:-go}"
mod=github.com/asynkron/protoactor-go
# go list names a module's directory only once it is in the module cache,
# which on a fresh machine it is not until something downloads it.
"$go" mod download "$mod"
src=$("$go" list -m -f '{{.Dir}}' "$mod")
test -n "$src" -a -d "$src" || { echo "prepare.sh: no directory for $mod in the module cache" >&2; exit 1; }
# The copy is shared by every checkout on the machine (two make test runs
# side by side, or a CI job beside a developer's): it is rebuilt only when
# this script, go.mod, go.sum or the module's source path changed, under a
# lock, and put in place by a rename, so a run never reads a half-written
# copy and never deletes another's.
mkdir -p "$(dirname "$out")"
stamp=$(cat "$0" go.mod go.sum <(echo "$src") | sha256sum | cut -d' ' -f1)
if command -v flock >/dev/null; then
	exec 9>"$out.lock"
	flock 9
fi
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ]; then
	exit 0
fi
final="$out"
out="$final.tmp.$$"
trap 'rm -rf "$out"' EXIT
rm -rf "$out"
mkdir -p "$out"
cp -r "$src" "$out/protoactor-go"
chmod -R u+w "$out/protoactor-go"
server="$out/protoactor-go/remote/server.go"
grep -q 'grpclog.SetLoggerV2(grpclog.NewLoggerV2(ioutil.Discard, ioutil.Discard, ioutil.Discard))' "$server"
sed -i 's|\tgrpclog.SetLoggerV2(grpclog.NewLoggerV2(ioutil.Discard, ioutil.Discard, ioutil.Discard))|\tgrpcLoggerOnce.Do(func() { grpclog.SetLoggerV2(grpclog.NewLoggerV2(ioutil.Discard, ioutil.Discard, ioutil.Discard)) })|' "$server"
printf '\n// grpcLoggerOnce: set gRPC'"'"'s global logger once per process (race run only).\nvar grpcLoggerOnce sync.Once\n' >> "$server"
grep -q '"sync"' "$server" || sed -i 's|^import (|import (\n\t"sync"|' "$server"
# Proto.Actor's MemberList.ContainsMemberID (the gossip actor's check of a
# request's sender) reads the member set without the list's lock, while a
# topology update replaces it under the lock: the race detector reports it
# whenever a member joins a cluster of several in one process. Nothing calls
# it with the lock held, so the copy takes the read lock there.
members="$out/protoactor-go/cluster/member_list.go"
grep -q '^	return ml.members.ContainsID(memberID)$' "$members"
sed -i 's|^	return ml.members.ContainsID(memberID)$|	ml.mutex.RLock()\n	defer ml.mutex.RUnlock()\n	return ml.members.ContainsID(memberID)|' "$members"
# BroadcastEvent (disthash's notice that an activation ended) reads the
# same set the same way: the copy takes the set under the read lock and
# sends outside it, as a topology update only ever replaces the set.
grep -q '^	for _, m := range ml.members.members {$' "$members"
sed -i 's|^	for _, m := range ml.members.members {$|	ml.mutex.RLock()\n	current := ml.members\n	ml.mutex.RUnlock()\n	for _, m := range current.members {|' "$members"
# Its remote's BlockList.IsBlocked and BlockedMembers read the blocked set
# without the lock Block writes it under (a member that left is blocked by
# the gossip while a connection request is checked, or while a cluster's
# shutdown computes its last topology): the copy takes the read lock there
# too.
blocklist="$out/protoactor-go/remote/blocklist.go"
grep -q '^	return bl.blockedMembers.Contains(memberID)$' "$blocklist"
sed -i 's|^	return bl.blockedMembers.Contains(memberID)$|	bl.mu.RLock()\n	defer bl.mu.RUnlock()\n	return bl.blockedMembers.Contains(memberID)|' "$blocklist"
grep -q '^	return bl.blockedMembers$' "$blocklist"
sed -i 's|^	return bl.blockedMembers$|	bl.mu.RLock()\n	defer bl.mu.RUnlock()\n	return bl.blockedMembers|' "$blocklist"
# Its gossip informer shuffles with one package-global math/rand.Rand,
# which is not safe for concurrent use: several cluster members in one
# process race on it. The copy uses math/rand's safe top-level functions.
informer="$out/protoactor-go/cluster/informer.go"
grep -q 'rnd\.Shuffle(' "$informer"
sed -i 's|rnd\.Shuffle(|rand.Shuffle(|' "$informer"
# Its remote's Shutdown sets the endpoint manager's stopped flag and the
# endpoint readers' suspended flag, plain bools that every delivery and
# every incoming stream read without synchronisation: a remote shut down
# while peers still talk to it (roam's Stop on an application's system)
# races there. The copy makes both flags atomic.
manager="$out/protoactor-go/remote/endpoint_manager.go"
reader="$out/protoactor-go/remote/endpoint_reader.go"
grep -q '^	stopped                   bool$' "$manager"
sed -i -e 's|^	stopped                   bool$|	stopped                   atomic.Bool|' \
	-e '/^		stopped:                   false,$/d' \
	-e 's|em\.stopped = true|em.stopped.Store(true)|' \
	-e 's|if em\.stopped {|if em.stopped.Load() {|' "$manager"
grep -q '^	suspended bool$' "$reader"
sed -i -e 's|^	suspended bool$|	suspended atomic.Bool|' \
	-e 's|case s\.suspended:|case s.suspended.Load():|' \
	-e 's|s\.suspended = toSuspend|s.suspended.Store(toSuspend)|' \
	-e 's|^import (|import (\n	"sync/atomic"|' "$reader"
# Its gossip actor sends a member a delta of the gossip state whose entries
# are the live state's own, and the next topology update rewrites those
# entries in place (setKey) while the remote's writer is still serializing
# the delta: the copy sends a deep copy, taken on the gossip actor's own
# goroutine.
gossip="$out/protoactor-go/cluster/gossip_actor.go"
grep -q '^		State:        memberStateDelta.State,$' "$gossip"
sed -i -e 's|^		State:        memberStateDelta.State,$|		State:        proto.Clone(memberStateDelta.State).(*GossipState),|' \
	-e 's|^import (|import (\n	"google.golang.org/protobuf/proto"|' "$gossip"
# Its endpoint manager's stop sets its connections map to nil while an
# endpoint writer that failed to connect publishes EndpointTerminatedEvent,
# whose handler (removeEndpoint) reads the map: a remote shut down while a
# connection attempt fails (a test's cleanup) races there. The copy keeps
# the map; a stopped manager makes no new connections anyway.
grep -q '^	em\.connections = nil$' "$manager"
sed -i 's|^	em\.connections = nil$|	// em.connections = nil: kept (race run), read by endpoint events still in flight|' "$manager"
# Its Future takes a reply by writing the result without the future's
# lock, then completing under it, while the future's own timeout, firing at
# that moment, completes it under the lock and hands the result to its
# continuations: a reply that arrives as its request times out (a grain
# call under load) races there. The copy writes the reply under the lock,
# and not at all once the future is done; what a continuation sees is what
# it saw when the two did not overlap.
future="$out/protoactor-go/actor/future.go"
test "$(grep -c '^		ref\.result = nil$\|^		ref\.err = ErrDeadLetter$\|^		ref\.result = msg$\|^	ref\.result = message$' "$future")" = 4
sed -i -e 's|^		ref\.result = nil$|		ref.setResult(nil, ErrDeadLetter)|' \
	-e '/^		ref\.err = ErrDeadLetter$/d' \
	-e 's|^		ref\.result = msg$|		ref.setResult(msg, nil)|' \
	-e 's|^	ref\.result = message$|	ref.setResult(message, nil)|' "$future"
cat >>"$future" <<'GO'

// setResult: a reply taken under the future's lock (race run only).
func (ref *futureProcess) setResult(result interface{}, err error) {
	ref.cond.L.Lock()
	defer ref.cond.L.Unlock()
	if ref.done {
		return
	}
	ref.result = result
	if err != nil {
		ref.err = err
	}
}
GO
cp go.mod "$out/go.mod"
cp go.sum "$out/go.sum"
"$go" mod edit -modfile="$out/go.mod" -replace "$mod=$final/protoactor-go"
echo "$stamp" >"$out/stamp"
rm -rf "$final.old.$$"
if [ -d "$final" ]; then mv "$final" "$final.old.$$"; fi
mv "$out" "$final"
rm -rf "$final.old.$$"
