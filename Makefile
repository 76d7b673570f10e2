# The two commands of the README. Both create .venv on first use (scripts/setup_venv.sh).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup ray demo test test-unit test-lab bench-scheduler artifacts replay peers bench-front bench-faults bench-soak agent-example agent-sessions

setup:
	@scripts/setup_venv.sh

# Ray, for engines placed on a Ray cluster (docs/cluster.md "A cluster on Ray"); with it
# installed, make test also runs the tests on a multi-node Ray cluster made on this machine.
ray: setup
	$(PY) -m pip --disable-pip-version-check -q install -e ".[ray]" -c constraints/cpu.txt

demo: setup
	$(PY) -m launcher examples/demo.toml --demo

# The product's tests (unit, integration and end-to-end on real engines and Ray) and the lab's
# tests that need no engine; the lab's experiments on live engines (trace builds, the live
# replay, VineLM collection) run with make test-lab.
test: setup
	$(PY) -m pytest tests -q -m "not (lab and engine)"

# Every test of the lab (tests/lab/, marked lab), live engines included.
test-lab: setup
	$(PY) -m pytest tests -q -m lab

# Agents pointed at the router unchanged (docs/agents.md): the OpenAI Agents SDK, the
# Responses API and Anthropic's Messages API each run a tool loop through two replicas of
# Qwen2.5-Coder-0.5B (fetched into ~/.cache/hetserve/real-models on first use, 491 MB).
agent-example: setup
	$(PY) -m pip --disable-pip-version-check -q install -e ".[agents]" -c constraints/cpu.txt
	$(PY) -m kernels_bench.lab.studies.fetch_real_models qwen2.5-coder-0.5b-instruct
	$(PY) examples/agent_loop.py --start examples/agent_loop.toml

# Recorded Codex and Claude Code sessions replayed with no hetserve header, with explicit
# program ids and round robin, in one run (docs/agents.md, "Measured").
agent-sessions: setup
	$(PY) -m kernels_bench.lab.studies.agent_sessions --repeats 2 \
		--out docs/research/agent-sessions.json

test-unit: setup
	$(PY) -m pytest tests/unit -q

bench-scheduler: setup
	$(PY) -m kernels_bench scheduler

# vLLM's and SGLang's routers (Rust, from PyPI) beside ours in the front benchmark.
peers: setup
	$(PY) -m pip --disable-pip-version-check -q install -e ".[peers]"

# The router's HTTP front under wrk load (apt-get install wrk), each router on one core,
# beside vllm-router, smg and a Python pass-through: docs/research/performance.md.
bench-front: peers
	$(PY) -m kernels_bench front --repeats 2

# Engines and the router killed and stopped under load (examples/faults.toml; ~12 min).
bench-faults: setup
	$(PY) -m kernels_bench faults

# The fault schedule repeated for 10 minutes under load, every process sampled
# (examples/soak.toml, two router workers; ~13 min): docs/reliability.md.
bench-soak: setup
	$(PY) -m kernels_bench soak --duration-s 600

# Every predictor the replay's policies route on (semantic router, length forest, KNN,
# capability), trained on the math and code traces together for the replay cluster's
# engines, cross-fitted in 5 folds (artifacts/fold-k/: fold k trained without the k-th
# fifth of the problems); then a profile of the replay cluster's engines on this machine
# and RouteBalance's TPOT heads trained on its telemetry (artifacts/profile/,
# artifacts/tpot/, shared by the folds); kept while the data, the settings, the cluster
# file and the machine are unchanged (docs/research/replay.md).
artifacts: setup
	$(PY) -m kernels_bench artifacts --folds 5 --profile examples/replay.toml

# The serving replay on this machine: two built-in engines of different speed
# (examples/replay.toml), the math problems 300-799 and the code trace mixed (no setting of
# the policies below was chosen on them), Poisson arrivals at 3 workflows/s, cross-fitted:
# each fold's runs replay 40 workflows of the problems its predictors held out (200 per
# policy and repeat); Chimera as first shipped (semantic router, congestion latency) and
# the two share-holding rules chosen on math 0-299 (docs/research/predictors.md "Holding the big
# model's share": the KNN's, the primary, and the semantic router's), STJF engines, against
# vLLM's balancer with FCFS engines and the random router at three shares of programs on
# the 1.5B (the curve a learned router must lie above), interleaved repeats with 95%
# intervals (docs/research/replay.md), then docs/research/results.md from it (with the intervals again
# without the problems the tau/delta_s sweep replayed). About 40 minutes on 2 cores.
# REPLAY_POLICIES='... oracle chimera:fcfs chimera-static:stjf' adds oracle lengths, FCFS
# engines and the static-prior ablation. The fast engine replays Qwen2.5-Coder-0.5B's runs
# and the slow one the 1.5B's (more accurate), so policies trade latency against score as
# on a real heterogeneous cluster.
REPLAY_TRACE ?= $(foreach i,3 4 5 6 7,data/traces/math-new$(i).jsonl.gz) data/traces/code.jsonl.gz
REPLAY_MODEL_MAP ?= tiny-a=qwen2.5-coder-0.5b-instruct,tiny-b=qwen2.5-coder-1.5b-instruct
REPLAY_POLICIES ?= chimera:stjf \
	'chimera:stjf@quality="knn",latency="finish",delta_s=0.3,target_share=0.3' \
	'chimera:stjf@quality="semantic_router",latency="finish",delta_s=0.5,target_share=0.35' \
	vllm:fcfs 'random_mix:fcfs@share=0.1,big_model="tiny-b"' \
	'random_mix:fcfs@share=0.3,big_model="tiny-b"' 'random_mix:fcfs@share=0.5,big_model="tiny-b"'
REPLAY_REPEATS ?= 2

replay: artifacts
	$(PY) -m kernels_bench replay --cluster examples/replay.toml --trace $(REPLAY_TRACE) \
		--model-map $(REPLAY_MODEL_MAP) --policies $(REPLAY_POLICIES) --artifacts artifacts \
		--rates 3 --arrival poisson --workflows 40 --seed 0 --priors-from-trace \
		--repeats $(REPLAY_REPEATS)
	$(PY) -m kernels_bench results --exclude-problems docs/research/results/tau-sweep-problems.json
