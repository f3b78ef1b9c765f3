# gpucoord developer targets. `make help` lists them.
GO      ?= go
PKGS    ?= ./...
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
export GOTOOLCHAIN := local

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the gpucoord binary into bin/
	$(GO) build -o bin/gpucoord ./cmd/gpucoord

.PHONY: image
image: ## Build the container image (IMAGE, default localhost/gpucoord:dev) with buildah, no registry: the CGO_ENABLED=0 binary and the libc it loads (scripts/image.sh; docs/KUBERNETES.md)
	scripts/image.sh

.PHONY: demo
demo: ## Run the main job on the embedded default: launch --standalone of the native engine, 2 nodes x 4 ranks
	$(GO) run ./cmd/gpucoord launch --standalone --nodes 2 --gpus-per-node 4 --tp 2 --pp 2 examples/jobs/mlp.yaml

.PHONY: plan-demo
plan-demo: ## The planner's worked example: gpt-13b on 32 H100s (tp 8, pp 4, ZeRO 1)
	$(GO) run ./cmd/gpucoord plan --cluster examples/clusters/dgx-h100-32.yaml --model gpt-13b --tp 8 --pp 4 --zero 1 --global-batch 16

.PHONY: deps
deps: ## Install the Debian packages the tests use (etcd-server, python3-torch) when missing
	scripts/deps.sh

# -p 3: cmd/gpucoord's clusters (about 13 minutes of CPU alone),
# the Slurm package's one box (mostly waiting on Slurm's timers) and the
# other packages one after the other. With -p 2 the Slurm package took the
# second place first, and the others ran after it, beside cmd/gpucoord's
# busiest minutes, where two coordinator tests with timeouts of their own
# failed (2026-11-28).
.PHONY: test
test: deps ## Run every test with the race detector (installs what the tests need first); the clusters in a box run 4 at a time, the Slurm box beside them, the other packages beside both
	$(GO) test -race -count=1 -timeout 25m -parallel 4 -p 3 $(PKGS)

.PHONY: test-short
test-short: ## The unit and integration tests alone (-short: no cluster in a box, no chaos), with the race detector: the edit loop
	$(GO) test -race -short -count=1 -timeout 5m $(PKGS)

.PHONY: stress
stress: ## Kill or preempt an agent at 40 random steps of an elastic job, kill a host of a job with held checkpoints at 20, cut a job's host off at 40 (shared and held checkpoints) and freeze an agent 20 times, measuring the overlap of generations, and lose one or two hosts of a re-planning job at 20 random steps (80 minutes; needs root; not part of make test)
	GPUCOORD_STRESS=1 $(GO) test -count=1 -timeout 120m -run 'TestElasticStress|TestClusterHeldStress|TestClusterPartitionStress|TestWorkerFrozenStress|TestClusterReplanStress' -v ./cmd/gpucoord

.PHONY: chaos
chaos: ## Seeded faults (agents, ranks, hosts cut off, partitions, frozen agents, coordinators, etcd members, delayed links, full /dev/shm) over two jobs on the cluster in a box, and a history checker; SEED=1 DURATION=30m (needs root; make test runs 60 s of seed 1)
	GPUCOORD_CHAOS_SEED=$${SEED:-1} GPUCOORD_CHAOS_DURATION=$${DURATION:-30m} $(GO) test -count=1 -timeout 4h -run '^TestChaos$$' -v ./cmd/gpucoord

.PHONY: bench-recovery
bench-recovery: ## Detection and recovery times after a node loss, across hosts (network namespaces) and on one host; needs root
	GPUCOORD_BENCH_RECOVERY=$${RUNS:-5} $(GO) test -count=1 -timeout 60m -run TestRecoveryTimes -v ./cmd/gpucoord

.PHONY: bench-checkpoint
bench-checkpoint: ## Checkpoint overhead per step, and recovery after a host kill, held by the agents against a shared directory; BASE=<gpucoord binaries, comma-separated> instead compares a checkpoint every step with those earlier builds, interleaved (minutes; needs root; not part of make test)
	GPUCOORD_BENCH_CKPT=$${RUNS:-3} GPUCOORD_BENCH_CKPT_BASE="$${BASE:-}" $(GO) test -count=1 -timeout 60m -run TestCheckpointCosts -v ./cmd/gpucoord

.PHONY: bench-load
bench-load: ## Control plane under NODES=256,1024,2048 simulated agents (16384 holds with ARGS="--lease-ttl 15s"): registration, rendezvous, loss through the failure detector, CPU, memory, etcd requests and writes per step, bytes per node per generation (minutes; not part of make test)
	GPUCOORD_BENCH_LOAD=$${NODES:-256,1024,2048} GPUCOORD_BENCH_LOAD_ARGS="$${ARGS:-}" $(GO) test -count=1 -timeout 30m -run TestControlPlaneLoad -v ./cmd/gpucoord

.PHONY: bench-gossip
bench-gossip: ## Gossip pool (memberlist) of MEMBERS=8,32,64,128 in one process over loopback UDP and TCP, or PxN for P failure-domain pools of N side by side (16x32): converge, detection, false deaths, CPU and bytes per member (minutes; not part of make test)
	GPUCOORD_BENCH_GOSSIP=$${MEMBERS:-8,32,64,128} $(GO) test -count=1 -timeout 30m -run TestPoolScale -v ./internal/gossip

.PHONY: bench-plan
bench-plan: ## The whole `gpucoord plan` process for 32,768 GPUs, text and --json, beside `gpucoord --version`: median, min and max wall ms of RUNS=10 runs and peak RSS (BASE=old binary times it alongside; scripts/bench_plan.sh; seconds; not part of make test)
	GO=$(GO) scripts/bench_plan.sh $${RUNS:-10}

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (staticcheck 2026.2.2, fetched through the module proxy)
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

.PHONY: bench
bench: ## Run the Go benchmarks (figures go in docs/BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 30s) and keep what they find in testdata/fuzz (network inputs, parsers, schedules)
	scripts/fuzz.sh

.PHONY: proto
proto: ## Regenerate proto/gpucoordpb from proto/gpucoord.proto (needs protoc, protoc-gen-go, protoc-gen-go-grpc)
	protoc --go_out=. --go_opt=module=github.com/gpucoord/gpucoord --go-grpc_out=. --go-grpc_opt=module=github.com/gpucoord/gpucoord proto/gpucoord.proto

.PHONY: tidy
tidy: ## go mod tidy, failing if go.mod or go.sum change
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum
