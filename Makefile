# Speculative Decoding course. `make lab` to learn, `make test` to check everything.
# Overridable: PYTHON, VENV, HOST, PORT, BROWSER=no, NB (notebooks to grade), CELL_TIMEOUT (seconds per cell when
# grading), MODEL_ANSWERS=no, PYTEST_ARGS, PIP_ARGS.
# Drill: TOPIC (a topic such as serving, or a notebook number such as 01), SEED, COUNT.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8888
BROWSER ?= yes
NB ?=
PYTEST_ARGS ?=
PIP_ARGS ?=
# TORCH=cpu: PyTorch's CPU-only build from PyTorch's own index (about 0.2 GB) instead of PyPI's default Linux build,
# which brings CUDA's libraries (about 3 GB of downloads); given on the first setup (or after make distclean).
TORCH ?=
TORCH_PIN := $(shell sed -n 's/^ *"\(torch==[^"]*\)",*$$/\1/p' pyproject.toml)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

.PHONY: help setup lab test test-cohort check-pins nbval test-ui test-hub test-cluster release reset grade grade-cohort formgrader feedback totals student-edition drill mock-interview models hf-models bench bench-notebook bench-serve bench-serve-notebook bench-frontier bench-frontier-notebook bench-parallel-state bench-parallel-state-notebook models-15 bench-drafters bench-drafters-notebook bench-eagle3 bench-eagle3-notebook heads bench-kernels gpu-check bench-cells bench-cohort clean distclean

help:
	@echo "make setup    create $(VENV)/ and install the course and its tools (every other target does it on first use);"
	@echo "              TORCH=cpu takes PyTorch's CPU-only build (Linux without an NVIDIA GPU: 0.2 GB instead of 3 GB)"
	@echo "make lab      set up on first use, then open the course in JupyterLab (HOST=$(HOST) PORT=$(PORT) BROWSER=$(BROWSER))"
	@echo "make grade    grade your notebooks/ against the hidden tests (NB=01 for one notebook; CELL_TIMEOUT=300 on a slow machine);"
	@echo "              then your written answers beside their model answers (MODEL_ANSWERS=no hides them)"
	@echo "make grade-cohort SUBMITTED=dir [COURSE=grader WORKERS=n OUT=dir CHANGED=yes]  autograde a cohort's submissions in"
	@echo "              the sandbox, in parallel, into the course's gradebook (README: For instructors)"
	@echo "make formgrader  formgrader on the course (COURSE=grader): written answers beside their model answers and rubrics"
	@echo "make feedback ASSIGNMENT=slug  feedback with the written scores, released through nbgrader's exchange (EXCHANGE=no)"
	@echo "make totals ASSIGNMENT=slug  automatic, written graded, written pending, late penalty and total per submission"
	@echo "make student-edition OUT=dir RELEASE=\"01 02\" ANSWERS=\"01\"  what students install: no answer they have not been given"
	@echo "make drill    practise alone: questions with fresh numbers, each checked at once with its derivation (TOPIC=serving or TOPIC=01, SEED=, COUNT=)"
	@echo "make mock-interview  a timed mock interview: numbers, choices and written answers, then a report of what to revise (SEED=, COUNT=)"
	@echo "make test     set up on first use, then run the test suite (under 10 minutes on 2 cores; not the cohort suite)"
	@echo "make test-cohort  grade whole cohorts of hostile submissions in the sandbox: the attack suite, shards (minutes)"
	@echo "make check-pins  resolve pyproject.toml from the registry for Linux (x86_64, aarch64) and macOS (PYPROJECT=path for another)"
	@echo "make nbval    run instructor notebooks top to bottom in-process (NB=05 for one; authors)"
	@echo "make test-ui  the browser test: JupyterLab in Debian's Chromium (apt-get install chromium); screenshots in artifacts/ui/"
	@echo "make test-hub  an instructor's whole workflow on a real JupyterHub on loopback (root; local accounts; a few minutes)"
	@echo "make test-cluster  grade a small cohort on a private one-node Slurm (Debian's slurm-wlm and munge, installed if absent; root)"
	@echo "make reset NB=05  start a notebook again from its blank version (yours is kept in notebooks/.backup/)"
	@echo "make release  regenerate notebooks/ from grader/source/ (authors only)"
	@echo "make models   train the target, the drafts and then the self-drafters (make heads) into data/models/ (about an hour on 2 cores)"
	@echo "make models-15  train notebook 15's parallel drafter, hybrid target, target update and re-distilled draft (about 15 min on 2 cores)"
	@echo "make heads    train notebook 12's Medusa heads and EAGLE drafter, and notebook 13's MTP- and EAGLE-3-style drafters, on the shipped target"
	@echo "make hf-models  write the shipped checkpoints as Hugging Face folders in artifacts/hf/ (python -m specdec.bench --target artifacts/hf/target --draft artifacts/hf/draft)"
	@echo "make bench    benchmark speculative decoding on data/models/ (not a test)"
	@echo "make bench-notebook  re-measure notebook 09's reference sweep into data/bench/nb09_full.json (about 8 min)"
	@echo "make bench-serve  the serving engine under load, speculation off / on / adaptive, 1-256 requests (artifacts/serve/)"
	@echo "make bench-serve-notebook  re-measure notebook 11's copy into data/bench/nb11_serve.json: the crossover experiment (about 10 min) and the closed loop (about 17 min)"
	@echo "make bench-frontier  notebook 14's measurements: the MoE target's routing, layer-skip acceptance by exit layer, forward costs by context (artifacts/frontier/; about 1 min)"
	@echo "make bench-frontier-notebook  the same into data/bench/nb14_frontier.json, the copy notebook 14 will read"
	@echo "make bench-parallel-state  notebook 15's measurements: parallel against autoregressive drafting by gamma, the hybrid's rollback strategies, acceptance before and after the target moves (artifacts/questions2026/)"
	@echo "make bench-parallel-state-notebook  the same into data/bench/nb15_parallel_state_drift.json, the copy notebook 15 reads"
	@echo "make bench-drafters  every proposer side by side on the target, code and math (notebook 12; artifacts/drafters/)"
	@echo "make bench-drafters-notebook  re-measure notebook 12's copy into data/bench/nb12_drafters.json (about 3 min)"
	@echo "make bench-eagle3  notebook 13's MTP-style and EAGLE-3-style drafters against EAGLE-1 (artifacts/drafters/eagle3.json; needs make heads)"
	@echo "make bench-eagle3-notebook  re-measure notebook 13's copy into data/bench/nb13_drafters.json"
	@echo "make bench-cohort  time cohort grading of 100 mixed submissions of notebook 02 (2 workers)"
	@echo "make bench-kernels  time the Triton verifier on a GPU against PyTorch and the bandwidth floor"
	@echo "make gpu-check  everything that needs a GPU in one run (about a minute) into artifacts/gpu-check.json; without one, the kernels' compile report"
	@echo "make bench-cells  time every graded test cell of the instructor notebooks (one thread; budget 10 s each)"
	@echo "make clean    remove grading reports and caches; distclean also removes $(VENV)"

# The environment: created once, reinstalled only when pyproject.toml changes.
$(STAMP): pyproject.toml
	@case "$(TORCH)" in ""|cpu) ;; *) echo "TORCH=$(TORCH): use TORCH=cpu (the CPU-only build) or leave it unset"; exit 2;; esac
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(filter cpu,$(TORCH)),$(BIN)/python -m pip install --quiet --no-compile $(PIP_ARGS) --index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)",)
	$(BIN)/python -m pip install --quiet --no-compile $(PIP_ARGS) -e ".[hf,test]"
	@# the bytecode pip would write on one core, on every core (measured: 126 s of setup -> 103 s on 2 cores)
	@# (a file it cannot compile, such as torch's Python 3.12-only test helper, only stays uncompiled: no error)
	@$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
	@touch $(STAMP)

# Cohort grading's sandbox: Debian's bubblewrap and libseccomp (util-linux's setpriv and prlimit come with the
# system; PyPI's pyseccomp, a dependency, compiles the filter with libseccomp).
SANDBOX_STAMP := $(VENV)/.installed-sandbox
$(SANDBOX_STAMP): $(STAMP)
	@{ command -v bwrap >/dev/null && ldconfig -p | grep -q libseccomp.so.2; } || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2 >/dev/null; } || \
		echo "note: bubblewrap or libseccomp is not installed, so cohort grading refuses untrusted submissions (apt-get install bubblewrap libseccomp2)"
	@! command -v bwrap >/dev/null || touch $@

setup: $(STAMP) $(SANDBOX_STAMP)

lab: $(STAMP)
	@$(BIN)/python -m specdec.course.release --missing
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks --ServerApp.ip=$(HOST) --ServerApp.port=$(PORT) \
		$(if $(filter no,$(BROWSER)),--no-browser,) $(if $(filter 0,$(shell id -u)),--allow-root,)

test: $(STAMP) $(SANDBOX_STAMP)
	$(BIN)/ruff check solutions tests tests_ui tests_cluster tests_hub
	$(BIN)/python -m pytest -m "not cohort" $(PYTEST_ARGS)

# Whole cohorts of hostile, broken and honest submissions graded in the sandbox (tests marked cohort): minutes.
test-cohort: $(STAMP) $(SANDBOX_STAMP)
	$(BIN)/python -m pytest -m cohort $(PYTEST_ARGS)

nbval: $(STAMP)
	$(BIN)/python -m pytest -o addopts="-ra -p no:cacheprovider" --nbval-lax $(if $(NB),$(wildcard grader/source/$(NB)*/*.ipynb),grader/source)

# The pins against the registry (needs it): pyproject.toml resolved by uv for Linux x86_64 and aarch64 and macOS.
PINS_STAMP := $(VENV)/.installed-pins
$(PINS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -e ".[hf,test,pins]"
	@touch $(PINS_STAMP)

check-pins: $(PINS_STAMP)
	$(BIN)/python tests/pins.py $(if $(PYPROJECT),--pyproject $(PYPROJECT),)

UI_STAMP := $(VENV)/.installed-ui
$(UI_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -e ".[hf,test,ui]"
	@touch $(UI_STAMP)

test-ui: $(UI_STAMP) $(HUB_STAMP) $(SANDBOX_STAMP)
	@test -x "$${CHROMIUM:-/usr/bin/chromium}" || { echo "make test-ui needs Debian's Chromium: apt-get install chromium (or CHROMIUM=path)"; exit 2; }
	$(BIN)/python -m pytest -o addopts="-ra -p no:cacheprovider" tests_ui

# nbgrader's exchange on a real JupyterHub on loopback, with local accounts (root): tests_hub/.
HUB_STAMP := $(VENV)/.installed-hub
CHP_VERSION := 5.2.0
$(HUB_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --no-compile $(PIP_ARGS) -e ".[hf,test,hub]"
	npm install --silent --prefix $(VENV)/hub --no-audit --no-fund --save-exact configurable-http-proxy@$(CHP_VERSION)
	@touch $@

test-hub: $(HUB_STAMP) $(SANDBOX_STAMP)
	@[ "$$(id -u)" = 0 ] || { echo "make test-hub makes local accounts for the hub's users: run it as root"; exit 2; }
	$(BIN)/python -m pytest -o addopts="-ra -p no:cacheprovider" $(PYTEST_ARGS) tests_hub

# grader/cluster/'s Slurm scripts on a real scheduler: tests_cluster/ starts munged, slurmctld and slurmd itself.
test-cluster: $(STAMP) $(SANDBOX_STAMP)
	@command -v slurmctld >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
	$(BIN)/python -m pytest -o addopts="-ra -p no:cacheprovider" $(PYTEST_ARGS) tests_cluster

release: $(STAMP)
	$(BIN)/python -m specdec.course.release

reset: $(STAMP)
	$(BIN)/python -m specdec.course.release --reset $(NB)

grade: $(STAMP)
	@$(BIN)/python -m specdec.course.grading $(NB) $(if $(CELL_TIMEOUT),--cell-timeout $(CELL_TIMEOUT),) \
		$(if $(filter no,$(MODEL_ANSWERS)),--no-model-answers,)

grade-cohort: $(STAMP) $(SANDBOX_STAMP)
	@test -n "$(SUBMITTED)" || { echo "usage: make grade-cohort SUBMITTED=path/to/submitted [COURSE=grader] [WORKERS=2] [OUT=cohort-grades] [TIMEOUT=600] [CELL_TIMEOUT=120] [MEMORY_MB=8192] [ASSIGNMENT=slug ...] [STUDENT=name ...] [CHANGED=yes]"; exit 2; }
	$(BIN)/python -m specdec.course.cohort "$(SUBMITTED)" --workers $(or $(WORKERS),2) --out "$(or $(OUT),cohort-grades)" \
		$(if $(or $(filter-out file,$(origin COURSE)),$(wildcard $(COURSE)/gradebook.db)),--course "$(COURSE)",) \
		$(if $(filter yes,$(CHANGED)),--changed,) \
		$(if $(TIMEOUT),--timeout $(TIMEOUT),) $(if $(CELL_TIMEOUT),--cell-timeout $(CELL_TIMEOUT),) \
		$(if $(MEMORY_MB),--memory-mb $(MEMORY_MB),) $(foreach a,$(ASSIGNMENT),--assignment $(a)) \
		$(foreach s,$(STUDENT),--student $(s))

# The instructor's course folder (nbgrader's course root: its gradebook, release/, submitted/, feedback/).
COURSE ?= grader

# formgrader on the course: written answers with their model answer and rubric beside them (Jupyter starts in the
# course folder, where formgrader finds nbgrader_config.py and the gradebook).
formgrader: $(STAMP)
	cd "$(COURSE)" && $(abspath $(BIN))/jupyter lab --ServerApp.ip=$(HOST) --ServerApp.port=$(PORT) \
		--LabApp.default_url=/formgrader $(if $(filter no,$(BROWSER)),--no-browser,) \
		$(if $(filter 0,$(shell id -u)),--allow-root,)

# Feedback with the written scores, then back through nbgrader's exchange (EXCHANGE=no: only render, for an LMS).
feedback: $(STAMP)
	@test -n "$(ASSIGNMENT)" || { echo "usage: make feedback ASSIGNMENT=slug [COURSE=grader] [EXCHANGE=no]"; exit 2; }
	$(BIN)/python -m specdec.course.gradebook feedback $(ASSIGNMENT) --course "$(COURSE)"
	$(if $(filter no,$(EXCHANGE)),,cd "$(COURSE)" && for a in $(ASSIGNMENT); do PATH="$(abspath $(BIN)):$$PATH" $(abspath $(BIN))/nbgrader release_feedback $$a || exit 1; done)

# The totals after the written answers: automatic, written graded, written pending, late penalty, total, maximum.
totals: $(STAMP)
	@test -n "$(ASSIGNMENT)" || { echo "usage: make totals ASSIGNMENT=slug [COURSE=grader] [OUT=file.csv]"; exit 2; }
	@$(BIN)/python -m specdec.course.gradebook totals $(ASSIGNMENT) --course "$(COURSE)" $(if $(OUT),--out "$(OUT)",)

# What a cohort's students install: RELEASE="01 02" notebooks, ANSWERS="01" references kept, into OUT (a new folder).
student-edition: $(STAMP)
	@test -n "$(OUT)" -a -n "$(RELEASE)" || { echo "usage: make student-edition OUT=dir RELEASE=\"01 02\" [ANSWERS=\"01\"]"; exit 2; }
	$(BIN)/python -m specdec.course.edition --out "$(OUT)" --release $(RELEASE) --answers $(ANSWERS)

drill: $(STAMP)
	@$(BIN)/python -m specdec.drill $(if $(TOPIC),--topic $(TOPIC),) $(if $(SEED),--seed $(SEED),) $(if $(COUNT),--count $(COUNT),)

mock-interview: $(STAMP)
	@$(BIN)/python -m specdec.drill --mock $(if $(SEED),--seed $(SEED),) $(if $(COUNT),--count $(COUNT),)

models: $(STAMP)
	$(BIN)/python -m specdec.models.train
	$(BIN)/python -m specdec.drafters.train
	$(BIN)/python -m specdec.questions2026.train

models-15: $(STAMP)
	$(BIN)/python -m specdec.questions2026.train

heads: $(STAMP)
	$(BIN)/python -m specdec.drafters.train

bench-drafters: $(STAMP)
	$(BIN)/python -m specdec.bench.drafters

bench-drafters-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench.drafters --notebook-reference data/bench/nb12_drafters.json

bench-eagle3: $(STAMP)
	$(BIN)/python -m specdec.bench.eagle3

bench-eagle3-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench.eagle3 --notebook-reference data/bench/nb13_drafters.json

bench: $(STAMP)
	$(BIN)/python -m specdec.bench --hf

hf-models: $(STAMP)
	$(BIN)/python -m specdec.models.hf --out artifacts/hf

bench-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench --notebook-reference data/bench/nb09_full.json

bench-serve: $(STAMP)
	$(BIN)/python -m specdec.bench.serve

bench-serve-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench.serve --notebook-reference data/bench/nb11_serve.json

bench-frontier: $(STAMP)
	$(BIN)/python -m specdec.bench.frontier

bench-frontier-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench.frontier --out data/bench/nb14_frontier.json

bench-parallel-state: $(STAMP)
	$(BIN)/python -m specdec.bench.questions2026

bench-parallel-state-notebook: $(STAMP)
	$(BIN)/python -m specdec.bench.questions2026 --out data/bench/nb15_parallel_state_drift.json

bench-cohort: $(STAMP)
	$(BIN)/python -m specdec.bench.cohort --copies 100 --workers 2

bench-kernels: $(STAMP)
	$(BIN)/python -m specdec.bench.kernels $(if $(PEAK),--peak-tbps $(PEAK),)

# The kernels compiled for sm_80 and sm_90, then (on a CUDA GPU) run against their references, timed, and the engines
# checked on the GPU: one JSON report.
gpu-check: $(STAMP)
	$(BIN)/python -m specdec.bench.gpu_check --out artifacts/gpu-check.json $(if $(PEAK),--peak-tbps $(PEAK),)

bench-cells: $(STAMP)
	$(BIN)/python -m specdec.bench.cells $(NB)

clean:
	rm -rf .grades .pytest_cache .hypothesis
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) solutions/*.egg-info
