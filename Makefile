# roam — every step CI and a new machine need lives here, the build of the
# Consul server the tests run against included (target consul).

SHELL := /bin/bash
GO ?= go

CONSUL_VERSION := 1.14.11
ROAM_CACHE ?= $(HOME)/.cache/roam
CONSUL_BIN := $(ROAM_CACHE)/consul-$(CONSUL_VERSION)/consul
PROTOC_GEN_GO_VERSION := v1.36.12
TOOLS_BIN := $(ROAM_CACHE)/bin

# Tests find the Consul binary through this variable.
export ROAM_CONSUL := $(CONSUL_BIN)

# Every package's tests run under the race detector, the multi-node ones
# included. Two or more Proto.Actor remotes in one process race inside
# Proto.Actor itself (remote.Start sets gRPC's global logger each time;
# docs/FAULTS.md, "The race detector"), which would hide races in roam's
# code; the race run therefore
# builds against a copy of Proto.Actor, made from the module cache by
# tools/race/prepare.sh, that sets that logger once per process. Nothing
# else is changed, and builds, the demo and benchmarks use the module as is.
RACE_MOD := $(ROAM_CACHE)/race-mod
# The test runs below pass -vet=off: go test's own vet runs a subset of
# go vet's analyzers on every package it tests, once per build variant
# (race with the race copy, plain, fuzz-instrumented), none of which lint's `go vet ./...` (all
# analyzers, test files included) can reuse from the cache. lint checks
# the same sources once, so those runs only repeated its work.
# -ldflags=-s links the test binaries without the ELF symbol table and
# without DWARF (-s implies -w): no test reads either (a panic's or a race
# report's stack comes from the runtime's own function table, which is
# kept), and a link then costs less CPU (internal/relocation's race test
# binary: 3.4 s of CPU, 2.6 s with -w; -s takes a further tenth off), for
# each of the 61 test binaries of the race run and every other part's.
TEST := $(GO) test -vet=off -ldflags=-s
RACE := $(TEST) -race -count=1 -modfile=$(RACE_MOD)/go.mod
empty :=
space := $(empty) $(empty)

# $(call timed,WHAT) prefixes a step of make test's parts: it prints the
# step's wall time and the CPU time of everything it ran (test binaries
# included), so that a slow run says which part and step took the time. On
# 2 cores the CPU total of all parts, more than any part's wall time,
# bounds the run.
timed = $(if $(wildcard /usr/bin/time),/usr/bin/time -f "[time] $@ $(1): %e s wall; %U s user; %S s sys")

.PHONY: test test-race test-race-root test-race-all test-consul test-consul-relocation test-consul-spot test-plain sim-check race-mod consul browser generate lint demo demo-consul bench bench-store clean-consul certs fuzz fuzz-short

## test: everything CI runs: every package's tests under -race (their
## real-Consul variants once more, without it);
## then 100,000 schedules of each deterministic simulation and the short
## chaos test on real processes (the fuzz targets' seed corpora run in the
## race run; make fuzz fuzzes them). The parts run side
## by side (TEST_JOBS of them, default 5): most of their time is tests
## waiting on sockets, processes and Consul, not the CPU. The parts that
## mostly wait (the race runs and the chaos test, which waits on real
## processes and leases) start first, the CPU-bound ones (sim-check,
## test-plain, lint) as slots free up and fill the cores the waiting
## leaves idle. Five slots, not four, since the root package's race run
## became a part of its own: with four, the chaos test would wait for a
## race part to end and then run its two minutes of faults at the end.
TEST_JOBS ?= 5
TEST_PARTS := test-race-root test-race-all test-consul-spot test-consul-relocation chaos-short sim-check test-plain lint
test: consul browser race-mod
	$(MAKE) --no-print-directory prebuild
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target $(TEST_PARTS)

# prebuild compiles every package of the module once per variant the
# parts use (race, against the race copy; and plain), before the parts
# start. Started side by side, the parts' go commands would each compile
# the packages a commit changed, all at once: go's build cache shares a
# finished result between processes, not work in progress, so two builds
# of one package at the same moment cost twice its CPU (measured: 13 s of
# CPU for internal/spot's packages after a change, 27 s for two at once;
# three race parts after a change to roamerr: 79 s of CPU, 74 s with the
# prebuild of every package first).
# The parts then compile only their test files. Commands (package main)
# are left out: go build would link each, only to discard it.
LIB_PACKAGES = $$($(GO) list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./...)
.PHONY: prebuild
prebuild:
	@test -f $(RACE_MOD)/go.mod || $(MAKE) --no-print-directory race-mod
	$(call timed,race) $(GO) build -race -modfile=$(RACE_MOD)/go.mod $(LIB_PACKAGES) & race=$$!; \
	$(call timed,plain) $(GO) build $(LIB_PACKAGES); plain=$$?; \
	wait $$race && exit $$plain

## browser: Debian's Chromium, for the web view's browser test (roamctl web).
browser:
	@command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)

## sim-check: 100,000 random schedules of the hand-off's deterministic
## simulation (and a quarter as many with Sessions, an eighth with a small
## payload budget and with Joins) and 100,000 of the Spot lifecycle's (the race
## run above runs 400 of each, RACE_SIM_SCHEDULES); and SIM_ONLY. The
## hand-off's run allocates fast and little survives a schedule: GOGC=400
## halves its GC work (62 s of CPU to 37 s).
sim-check:
	@for n in $(SIM_ONLY); do grep -q "^func $$n(t \*testing.T)" internal/spotsim/*_test.go || \
		{ echo "SIM_ONLY names $$n, which internal/spotsim does not have"; exit 1; }; done
	SIM_SCHEDULES=100000 GOGC=400 $(call timed,relocation/sim) $(TEST) -count=1 -run '^TestRandomSchedules(WithSessions|WithBudget|WithJoins)?$$' ./internal/relocation/sim
	SIM_SCHEDULES=100000 $(call timed,spotsim) $(TEST) -count=1 -run '^(TestRandomSchedules|$(SIM_ONLY))$$' ./internal/spotsim

## nodesim: the real drivers under N seeded fault schedules (default 50;
## internal/nodesim, of which make test runs 3): make nodesim [N=200] [SEED=1].
.PHONY: nodesim
nodesim:
	set -o pipefail; NODESIM_SCHEDULES=$(or $(N),50) NODESIM_SEED=$(or $(SEED),1) $(GO) test -count=1 -run '^TestFaultSchedulesOnRealNodes$$' -v ./internal/nodesim | grep -E '^(---|    ---|ok|FAIL)|seed [0-9]+:'

race-mod:
	GO=$(GO) tools/race/prepare.sh $(RACE_MOD)

# Multi-member Proto.Actor cluster tests (examples/grains, the grain
# lookup) run under -race too: the race copy of Proto.Actor has its known
# internal races patched (tools/race/prepare.sh).
test-race: race-mod
	$(MAKE) --no-print-directory prebuild
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target test-race-root test-race-all test-consul-spot test-consul-relocation test-plain

# The parts leave preparing the race copy to test and test-race (once, not
# once per part side by side).
# Some tests run in another part instead. In test-consul-spot, which
# runs beside this one: internal/spot's Consul variants (ROAM_TEST_STORE=memstore here runs only
# its memstore ones; the Consul ones wait on Consul's sessions in real time,
# most of that package's time). In test-plain: the hand-off's randomized
# moves on Consul (1,000 moves; the same driver code runs them on memstore
# here, under -race), and the README's programs (each
# builds and runs a program of its own, without the race detector whatever
# this run's flags: here they would only repeat what test-plain does).
# The two simulations run RACE_SIM_SCHEDULES random schedules here instead
# of their default 2,000: sim-check runs seeds 1 to 100,000 of the same
# simulations without the race detector, so what this run adds is only the
# race detector on the workers that run schedules side by side, which a few
# hundred schedules exercise as well as 2,000 (at four to six times the CPU
# per schedule). 400 keeps the check that the Session simulation's hold
# limit and seal timeout were exercised, which needs 400 or more.
RACE_SIM_SCHEDULES := 400
# SIM_ONLY run in sim-check instead: sweeps of a simulation that run one
# schedule after another on the test's goroutine, which the race detector
# has nothing to check in but makes several times slower. The Spot
# lifecycle's checkpoint sabotages: until its invariant catches each one,
# up to 3,000 schedules apiece (close-no-seal needs 1,165).
SIM_ONLY := TestCheckerCatchesCheckpointSabotages
RACE_ALL_ELSEWHERE := TestRandomizedMovesKeepEveryMessageOnceOnConsul TestREADMEExampleRuns TestOutsideModuleFromTheREADME $(SIM_ONLY)
# go test builds and runs RACE_P things at a time (its -p; the default is
# the number of cores), compiles and links and test binaries alike. Most
# test binaries wait on sockets, leases and child processes, so a slot
# they hold leaves its core idle: with 3 slots this part took 195 s alone
# on a quiet machine, with 5 (and RACE_FIRST) 120 s, for less CPU.
RACE_P ?= 5
# go test starts packages in the order it is given them. The test binaries
# that run longest (a minute each alone, 20 s to 40 s for the others
# here) start first, so that none of them starts near the end, when
# nothing else is left to run beside it: in the order of go list,
# internal/relocation, internal/spot and location/consulstore ran last.
RACE_FIRST := ./internal/relocation ./location/consulstore ./examples/grains ./internal/spot ./internal/meshnode \
	./internal/extension ./internal/nodesim ./internal/sessionhost ./internal/relocation/mailbox
# The hand-off's randomized moves on memstore make RACE_RANDOM_MOVES moves
# here instead of 1,000: test-plain makes the 1,000 without the race
# detector, on memstore and on Consul, with the same checks (every message
# once, order per sender, one owner serving). What this run adds is the
# race detector on the drivers while senders and moves interleave, which
# 250 moves among four senders exercise as 1,000 do (measured alone, one
# after the other, under -race: 1,000 moves 30 s and 23 s of CPU, 250
# moves 5 s and 6 s; the 1,000 without -race 5 s and 7 s).
RACE_RANDOM_MOVES := 250
RACE_ALL_ENV := ROAM_REQUIRE_BROWSER=1 ROAM_TEST_STORE=memstore SIM_SCHEDULES=$(RACE_SIM_SCHEDULES) ROAM_RANDOM_MOVES=$(RACE_RANDOM_MOVES)
test-race-all:
	@test -f $(RACE_MOD)/go.mod || $(MAKE) --no-print-directory race-mod
	set -o pipefail; first=$$($(GO) list $(RACE_FIRST)) && all=$$($(GO) list ./... | grep -v /bench/baseline | grep -vxF "$$($(GO) list -m)") || exit 1; \
	$(RACE_ALL_ENV) $(call timed,all packages) $(RACE) -p $(RACE_P) -skip '^($(subst $(space),|,$(strip $(RACE_ALL_ELSEWHERE))))$$' $$first $$(echo "$$all" | grep -vxF "$$first")

# The root package's tests, under the same flags, as a part of its own.
# They run one after another in one process and spend most of their time
# waiting in real time (leases, Consul, stop futures, scenarios that
# outlast a timeout): on a quiet machine 173 s of wall time for 63 s of
# CPU, the longest test binary of test-race-all, which it alone drew out.
# Here ROOT_SHARDS processes of the same test binary each run every
# ROOT_SHARDS-th test of the package's list, side by side, as go test
# runs packages; each test still runs alone in its process, as before.
# Two shards took 89 s and 80 s (95 s for the part, the same 63 s of CPU).
ROOT_SHARDS ?= 2
test-race-root:
	@test -f $(RACE_MOD)/go.mod || $(MAKE) --no-print-directory race-mod
	@set -o pipefail; names=$$($(RACE) -list '.*' . | grep -E '^(Test|Example)' | \
		grep -vxE '$(subst $(space),|,$(strip $(RACE_ALL_ELSEWHERE)))') || exit 1; \
	out=$$(mktemp -d); pids=; \
	for i in $$(seq 0 $$(($(ROOT_SHARDS) - 1))); do \
		run=$$(echo "$$names" | awk -v n=$(ROOT_SHARDS) -v i=$$i 'NR % n == i' | paste -sd'|'); \
		echo "root package, shard $$i: $$(echo "$$names" | awk -v n=$(ROOT_SHARDS) -v i=$$i 'NR % n == i' | wc -l) tests"; \
		$(RACE_ALL_ENV) $(call timed,root package shard $$i) $(RACE) -run "^($$run)\$$" . >$$out/$$i 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; cat $$out/*; rm -rf $$out; exit $$rc

# The hand-off tests whose outcome depends on what the Location Store does,
# again on a real Consul (ROAM_TEST_STORE=consul): its CAS and versions, its
# watches and reads on the delivery path, leases ending on its own clock,
# outages, indeterminate writes. The others of the package (the transport:
# chunk link, TLS, budget and tickets, batches and cutover; timers, metrics,
# sampling, policies, supervision) pass the same on either store, or never
# open one, and run once, on memstore, in test-race-all.
#   the hand-off (spec 000) and its CAS: TestSavedWorkRunsBeforeRelayExactlyOnce,
#     TestExplicitFailureRestoresTheSource, TestCapabilityRefusalNeverSeals,
#     TestOnlyTheTargetWritesTheOwner, TestAnotherOwnerMakesTheMoveStale,
#     TestInstanceSpotMovesThroughTheSameCAS, TestActorMovesWithStateAndQueueWhileReceiving
#   indeterminate and failed writes: TestCASRetriesConvergeOnIndeterminateOutcomes,
#     TestLocationUpdateFailedRemovesTheTarget, TestCommitConfirmedWithoutTheTargetsNotice
#   reconciling through the store, fencing, leases: TestNoReplyReconcilesThenExplicitFailureRestores,
#     TestReconcileAdoptsACommittedTarget, TestSilentTargetIsFencedOutAndTheSourceServesAgain,
#     TestTargetLostAfterRelayReadyIsFencedOutAndTheSourceServesAgain,
#     TestAMoveRetriedAtOnceAfterAFenceOutIsMade, TestAnOwnerSeenGoneIsEndedOnlyAfterALeaseTTL
#   a store outage: TestAStoreOutageAtTheSealEndsTheMoveAtItsRestoreDeadline
#   delivery that reads the owner, node and generation from the store:
#     TestFollowPastEightHopsIsDeliveredFromTheStore, TestFollowPastTheLimitToAGoneObjectFailsTyped,
#     TestFollowPastTheLimitDoesNotOvertakeEarlierSends, TestFollowThroughTheStoreTellsTheSender,
#     TestFollowToANodeWhoseConnectionEndedIsDeliveredFromTheStore,
#     TestFollowToANodeRestartedUnderTheSameAddress, TestFollowDrainsALeavingHopBeforeTheStore,
#     TestSendsThroughAGoneNodeOrIncarnationAreRedelivered, TestLeavingNodeIsNoLongerSentTo,
#     TestPendingRedeliveryFailsLoudlyWhenTheNodeStops,
#     TestASendToADeletedActorDoesNotReachItsNextIncarnation,
#     TestReleasableEndedIsJudgedByTheNodesThatHostTheKind
# (The randomized moves on Consul run in test-plain.)
# test-consul-spot runs internal/spot's Consul variants, which
# test-race-all leaves out; its tests without a Consul variant skip there
# (they run in test-race-all). The two are parts of their own, side by
# side: both mostly wait on Consul's sessions in real time.
# Neither runs under -race: the same tests run under it on memstore in
# test-race-all, through the same driver and Spot manager code, and the
# Consul client's own concurrency is raced in location/consulstore's
# tests. Under -race these two cost 97 s of CPU on two cores, which the
# whole of make test is bound by (internal/spot's alone: 73 s under -race,
# 38 s without).
RELOCATION_ON_CONSUL := TestSavedWorkRunsBeforeRelayExactlyOnce TestExplicitFailureRestoresTheSource \
	TestCapabilityRefusalNeverSeals TestOnlyTheTargetWritesTheOwner TestAnotherOwnerMakesTheMoveStale \
	TestInstanceSpotMovesThroughTheSameCAS TestActorMovesWithStateAndQueueWhileReceiving \
	TestCASRetriesConvergeOnIndeterminateOutcomes TestLocationUpdateFailedRemovesTheTarget \
	TestCommitConfirmedWithoutTheTargetsNotice \
	TestNoReplyReconcilesThenExplicitFailureRestores TestReconcileAdoptsACommittedTarget \
	TestSilentTargetIsFencedOutAndTheSourceServesAgain TestTargetLostAfterRelayReadyIsFencedOutAndTheSourceServesAgain \
	TestAMoveRetriedAtOnceAfterAFenceOutIsMade TestAnOwnerSeenGoneIsEndedOnlyAfterALeaseTTL \
	TestAStoreOutageAtTheSealEndsTheMoveAtItsRestoreDeadline \
	TestFollowPastEightHopsIsDeliveredFromTheStore TestFollowPastTheLimitToAGoneObjectFailsTyped \
	TestFollowPastTheLimitDoesNotOvertakeEarlierSends TestFollowThroughTheStoreTellsTheSender \
	TestFollowToANodeWhoseConnectionEndedIsDeliveredFromTheStore TestFollowToANodeRestartedUnderTheSameAddress \
	TestFollowDrainsALeavingHopBeforeTheStore TestSendsThroughAGoneNodeOrIncarnationAreRedelivered \
	TestLeavingNodeIsNoLongerSentTo TestPendingRedeliveryFailsLoudlyWhenTheNodeStops \
	TestASendToADeletedActorDoesNotReachItsNextIncarnation TestReleasableEndedIsJudgedByTheNodesThatHostTheKind
test-consul: test-consul-relocation test-consul-spot
test-consul-relocation:
	@for n in $(RELOCATION_ON_CONSUL); do grep -q "^func $$n(t \*testing.T)" internal/relocation/*_test.go || \
		{ echo "RELOCATION_ON_CONSUL names $$n, which internal/relocation does not have"; exit 1; }; done
	ROAM_TEST_STORE=consul $(call timed,internal/relocation) $(TEST) -count=1 -run '^($(subst $(space),|,$(strip $(RELOCATION_ON_CONSUL))))$$' ./internal/relocation
test-consul-spot:
	ROAM_TEST_STORE=consul $(call timed,internal/spot) $(TEST) -count=1 ./internal/spot

# The tests that run Proto.Actor's own cluster or stop remotes beside
# running peers once more against Proto.Actor as applications build it
# (no -modfile), so that none passes only because of the race copy's
# patches: those patch the cluster's gossip, member list, informer and
# block list, and a remote's shutdown while peers still talk to it
# (tools/race/prepare.sh); a test that exercises none of that runs the
# same code either way, and runs once, in test-race-all. PLAIN_TESTS are
# the root package's: a Proto.Actor cluster under roam (its lookup, its
# kinds, its ClusterInit, its shutdown without roam's Stop), and rejoins
# and stops of a node whose peers keep running; then the grain example's
# moves on a cluster of members (examples/grains). Without -race: these
# tests start two or more remotes in one process, which race inside the
# unpatched Proto.Actor (remote.Start's gRPC logger, see above). The
# README's programs run only here (TestREADMEExampleRuns in the root
# package, and examples/grains' outside module): they build programs
# without -race; so does bench/baseline, which runs only here. Last, the
# hand-off's 1,000 randomized moves on a real Consul, and the same on
# memstore (test-race-all makes RACE_RANDOM_MOVES of them under -race):
# what Consul adds is its answers' timing, which the race detector's
# fourfold CPU would only slow.
PLAIN_TESTS := TestBreakFromClusterKindWithoutProtoCluster TestBreakClusterInitTwiceWithClusterProps \
	TestBreakKindNameClashSwitchesLookupSilently TestBreakRejoinOfAClusterMember TestBreakClusterShutdownWithoutRoamStop \
	TestBreakARemoteConfigWidenedAfterwardsIsRefused ExampleRoam_IdentityLookup \
	TestBreakRejoinWindowDropsSendsSilently TestBreakStopDuringRejoin TestBreakSecondRejoin \
	TestBreakCrashedFixedPortNodeCannotRestart TestStopEndsTheRejoinsClaim TestStopAfterRejoinLeavesNoGoroutine \
	TestRejoinOnTheApplicationsSystem TestREADMEExampleRuns
PLAIN_GRAINS_TESTS := TestGrainsMoveWithStateWhileAPlainKindAnswers TestOutsideModuleFromTheREADME
test-plain:
	@for n in $(PLAIN_TESTS); do grep -q "^func $$n(t \*testing.T)\|^func $$n()" *_test.go || \
		{ echo "PLAIN_TESTS names $$n, which the root package does not have"; exit 1; }; done
	@for n in $(PLAIN_GRAINS_TESTS); do grep -q "^func $$n(t \*testing.T)" examples/grains/*_test.go || \
		{ echo "PLAIN_GRAINS_TESTS names $$n, which examples/grains does not have"; exit 1; }; done
	$(call timed,bench/baseline) $(TEST) -count=1 ./bench/baseline
	$(call timed,root package) $(TEST) -count=1 -run '^($(subst $(space),|,$(strip $(PLAIN_TESTS))))$$' .
	$(call timed,examples/grains) $(TEST) -count=1 -run '^($(subst $(space),|,$(strip $(PLAIN_GRAINS_TESTS))))$$' ./examples/grains
	$(call timed,randomized moves) $(TEST) -count=1 -run '^TestRandomizedMovesKeepEveryMessageOnce(OnConsul)?$$' ./internal/relocation

## consul: build Consul v$(CONSUL_VERSION) once into $(ROAM_CACHE) and reuse it.
consul: $(CONSUL_BIN)

# The path names the version, so the binary is reused whenever it exists
# (a fresh clone's newer file times must not trigger a rebuild).
$(CONSUL_BIN):
	@echo "building Consul $(CONSUL_VERSION) into $@ (10-15 minutes on 2 cores, once)"
	cd tools/consul && $(GO) build -trimpath -o $@.tmp github.com/hashicorp/consul
	mv $@.tmp $@

clean-consul:
	rm -f $(CONSUL_BIN)

## generate: regenerate the committed protobuf code (and the example's grain code).
generate: $(TOOLS_BIN)/protoc-gen-go $(TOOLS_BIN)/protoc-gen-go-grain
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler)
	protoc --plugin=protoc-gen-go=$(TOOLS_BIN)/protoc-gen-go \
		--go_out=. --go_opt=module=github.com/roamactors/roam \
		-I messages messages/*.proto
	protoc --plugin=protoc-gen-go=$(TOOLS_BIN)/protoc-gen-go \
		--go_out=. --go_opt=module=github.com/roamactors/roam \
		-I messages -I examples/chat/chatpb examples/chat/chatpb/*.proto
	protoc --plugin=protoc-gen-go=$(TOOLS_BIN)/protoc-gen-go --plugin=protoc-gen-go-grain=$(TOOLS_BIN)/protoc-gen-go-grain \
		--go_out=. --go_opt=module=github.com/roamactors/roam \
		--go-grain_out=. --go-grain_opt=module=github.com/roamactors/roam \
		-I examples/grains/shoppb examples/grains/shoppb/*.proto

# Proto.Actor's grain generator, at the Proto.Actor version go.mod pins.
$(TOOLS_BIN)/protoc-gen-go-grain: go.mod
	$(GO) build -o $@ github.com/asynkron/protoactor-go/protobuf/protoc-gen-go-grain

$(TOOLS_BIN)/protoc-gen-go:
	GOBIN=$(TOOLS_BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

## lint: formatting, vet, and the public API's own check.
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(call timed,vet) $(GO) vet ./...
	# No public package names an internal type in its exported API.
	$(call timed,apicheck) $(TEST) -count=1 ./internal/apicheck

## demo: the main job, on the embedded store; DIRECTOR=1 runs the placement
## director with co-location on every node (users' Actors follow their rooms).
demo:
	$(GO) run ./cmd/roam-demo $(if $(DIRECTOR),--director)

## demo-consul: the same with a real Consul and four chat-node processes;
## TLS=1 runs every process with mutual TLS (certificates from `make certs`),
## DIRECTOR=1 the placement director (watch it with `roamctl web`: the demo
## prints the command).
demo-consul: consul $(if $(TLS),certs)
	$(GO) build -o $(TOOLS_BIN)/chat-node ./examples/chat/cmd/chat-node
	$(GO) run ./cmd/roam-demo --store=consul --chat-node=$(TOOLS_BIN)/chat-node $(if $(TLS),--tls-dir=$(CERTS_DIR)) $(if $(DIRECTOR),--director)

## roamctl: the operators' command (docs/OPERATIONS.md), into ./bin/roamctl.
.PHONY: roamctl
roamctl:
	$(GO) build -o bin/roamctl ./cmd/roamctl

## certs: a throwaway CA and a node certificate for 127.0.0.1 and localhost
## in $(CERTS_DIR), for trying mutual TLS on one machine (docs/SECURITY.md).
CERTS_DIR := $(ROAM_CACHE)/certs
certs:
	$(GO) run ./cmd/roam-certs -dir $(CERTS_DIR)

## fuzz: every fuzz target for FUZZTIME each (default 200,000 runs): the
## remote frame check, frame splitting, a target's control messages, every
## control message delivered to a running node, the payload decoder, Consul
## key escaping. fuzz-short: 3,000 runs each. Budgets are
## run counts, not durations: with a duration, Go 1.26's fuzz coordinator
## can fail a target with a bare "context deadline exceeded" at the end of
## the window on a busy machine (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 200000x
FUZZ_TARGETS := ./internal/meshnode:FuzzRemoteFrame ./internal/meshnode:FuzzSplitBatch ./internal/relocation:FuzzTargetControl ./internal/extension:FuzzControlMessages \
	./internal/relocation/envelope:FuzzDecode ./location/consulstore:FuzzEscapeRoundTrip \
	./examples/chat:FuzzGateway
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(call timed,$$name) $(TEST) -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

# fuzz-short is not a part of make test. It cost about 136 s of CPU there
# (an eighth of the whole), most of it building a fuzz-instrumented test
# binary per package, to try 3,000 inputs per target, 1.5% of the 200,000
# make fuzz tries. What
# make test must not lose, each target's seed corpus (the f.Add inputs and
# testdata/fuzz), runs as an ordinary test in test-race-all, under -race.
fuzz-short:
	$(MAKE) --no-print-directory fuzz FUZZTIME=3000x

## bench: relocation pauses, throughput, many moves, drains, cold activation,
## a million idle Spots and baselines, medians of several runs, into
## bench/RESULTS.md (with machine, date and commit). About 25 minutes on two
## cores; the million Spots need about 6 GiB of memory (-scale N for fewer).
bench: consul
	$(GO) run ./bench -runs 3 -out bench/RESULTS.md

## bench-store: store benchmarks on both stores, six runs each, benchstat medians.
bench-store: consul $(TOOLS_BIN)/benchstat
	mkdir -p bench/out
	$(GO) test -run '^$$' -bench . -count 6 ./location/memstore ./location/consulstore | tee bench/out/store.txt
	$(TOOLS_BIN)/benchstat bench/out/store.txt

$(TOOLS_BIN)/benchstat:
	GOBIN=$(TOOLS_BIN) $(GO) install golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

## chaos: the chaos test on real processes: every fault (node SIGKILL,
## a move's target killed between relay-ready and commit, node SIGSTOP past
## the lease TTL, Consul SIGSTOP 5 s and 25 s, Consul restart, Consul down
## past the TTL, the leader of a three-server Consul killed mid-move, a
## network cut, a node isolated 25 s), about 13 minutes; prints a table and
## fails on a non-zero safety figure. Then the chat itself on Consul (four
## chat-node processes, one SIGKILLed under load, as `make demo-consul`; then
## again with Consul paused 25 s instead, past every node's lease, the clients
## connecting again when told), failing on any loss or duplicate the fault
## does not account for.
## chaos-short: node SIGKILL, node SIGSTOP past the TTL, Consul restart and a rolling restart, about
## 2 min, with the same verdict (for `make test`), with the placement director on every node (its idle
## moves join the test's own). DIRECTOR=1 runs `make chaos` with it too.
.PHONY: chaos chaos-short
chaos: consul
	$(GO) build -o $(TOOLS_BIN)/roam-chaos ./cmd/roam-chaos
	$(TOOLS_BIN)/roam-chaos run $(if $(DIRECTOR),-director)
	$(GO) build -o $(TOOLS_BIN)/chat-node ./examples/chat/cmd/chat-node
	$(GO) run ./cmd/roam-demo --store=consul --chat-node=$(TOOLS_BIN)/chat-node $(if $(DIRECTOR),--director)
	$(GO) run ./cmd/roam-demo --store=consul --chat-node=$(TOOLS_BIN)/chat-node --fault=consul-pause $(if $(DIRECTOR),--director)

chaos-short: consul
	$(call timed,build) $(GO) build -o $(TOOLS_BIN)/roam-chaos ./cmd/roam-chaos
	$(call timed,run) $(TOOLS_BIN)/roam-chaos run -short -director

## sim: replay one schedule of the hand-off's deterministic simulation
## (internal/relocation/sim) and print its trace: make sim SEED=<n>.
.PHONY: sim
sim:
	@test -n "$(SEED)" || { echo "usage: make sim SEED=<n>"; exit 2; }
	$(GO) test -count=1 -run '^TestReplay$$' -v ./internal/relocation/sim -args -sim.seed=$(SEED) -sim.sessions=$(if $(SESSIONS),true,false) -sim.budget=$(if $(BUDGET),true,false) -sim.joins=$(if $(JOINS),true,false)

## sim-spot: replay one schedule of the Spot lifecycle's deterministic
## simulation (internal/spotsim) and print its trace: make sim-spot SEED=<n>.
.PHONY: sim-spot
sim-spot:
	@test -n "$(SEED)" || { echo "usage: make sim-spot SEED=<n>"; exit 2; }
	$(GO) test -count=1 -run '^TestReplay$$' -v ./internal/spotsim -args -sim.seed=$(SEED)
