# Distributed optimization of large models: course repository.
# `make lab` and `make test` are all a newcomer needs; both build .venv first if it is missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# make hub's JupyterHub (pyproject's [hub] extra); make test-browser tests the hub too
HUB_STAMP := $(VENV)/.hub-installed
# nbgrader's command line and notebooks run on this environment's Python.
export PATH := $(CURDIR)/$(BIN):$(PATH)
# One OpenMP thread per process: torch.distributed ranks share few cores.
export OMP_NUM_THREADS ?= 1

SECTION ?=
STUDENT ?=
JOBS ?=
NB ?=
DB ?=
SHARD ?=
FORCE ?=
LAB_ARGS ?=
PYTEST_ARGS ?=

.PHONY: hub help install lab test test-fast spread test-browser release execute section-costs \
	collect formgrader grade grade-report grade-demo bench-grade check gpu-check lint clean

help:
	@echo "make lab       install (first time) and open JupyterLab on notebooks/"
	@echo "make test      install (first time) and run every test (about 13 minutes on 2 cores)"
	@echo "make test-fast  the unit tests only (no real-engine runs, class runs or notebooks)"
	@echo "make check NB=notebooks/<section>/<name>.ipynb   self-check a notebook before submitting"
	@echo "make spread [SECTION=..]  how printed numbers move across CPU kernel selections"
	@echo "make release   regenerate notebooks/ from solutions/ (course authors)"
	@echo "make execute   re-run the reference notebooks in solutions/ and store their outputs"
	@echo "make collect FROM=<zip> SECTION=.. [TIMES=..]   an LMS download (Canvas, Moodle) into autograder/submitted/"
	@echo "make formgrader   nbgrader's formgrader for this course: scores set by hand (port 8890)"
	@echo "make grade [SECTION=..] [STUDENT=a,b] [JOBS=..] [FORCE=1] [RUN_ALL=1]   grade what changed in autograder/submitted/ (FORCE=1: all; RUN_ALL=1: also the show-only cells)"
	@echo "make grade DB=postgresql://... SHARD=i/n   grade share i of n (one per machine)"
	@echo "make grade-report [DB=..]   grades.csv and report.md from the gradebook (after shards)"
	@echo "make section-costs   measure each section's grading cost (balances the shards)"
	@echo "make grade-demo   grade a demo class in a scratch copy (prints grades and time)"
	@echo "make bench-grade [PART=catalogue|course|sections|class]  time make grade against nbgrader, Run-All and the floor"
	@echo "make test-browser   JupyterLab driven in headless Chromium (about 15 minutes)"
	@echo "make hub       the course server: JupyterHub, nbgrader's exchange, grading on submit"
	@echo "               ports 8000, 8001, 8002: COURSEHUB_PORT, COURSEHUB_HUB_PORT, COURSEHUB_PROXY_API_PORT"
	@echo "make gpu-check  on a GPU node: rank code on NCCL, all-reduce alpha/beta, GPT tokens/s and MFU"
	@echo "make lint      ruff over every .py file (lint and format)"
	@echo "make clean     remove the environment and the autograder's runtime state"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
		"Python 3.11 or newer is needed; run e.g. make test PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $(STAMP)

install: $(STAMP)

# Jupyter refuses to run as root unless told to (containers, CI); ordinary users never are.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ALLOW_ROOT) $(LAB_ARGS)

# tests/ plus nbval over every reference notebook (outputs compared with the stored ones).
NBVAL := --nbval --nbval-sanitize-with autograder/nbval_sanitize.cfg --nbval-cell-timeout 300

# nbval runs each reference notebook under other CPU kernels than this machine's
# (solutions/conftest.py; NBVAL_KERNELS=native to use the native ones).
# The servers of the sharded-grading tests (PostgreSQL, Slurm: Debian packages) are installed
# first where this user may (root); elsewhere those tests say why they are skipped.
test: $(STAMP)
	tests/grader/install_servers.sh
	$(BIN)/python -m pytest -n 2 --dist loadfile tests solutions $(NBVAL) $(PYTEST_ARGS)

# How far each printed number moves with the kernels: run before choosing digits or a band.
spread: $(STAMP)
	$(BIN)/python -m autograder.spread $(SECTION)

# Every test not marked slow (conftest.py marks by path): about a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow" tests

release: $(STAMP)
	$(BIN)/python -m autograder.release $(SECTION)

execute: $(STAMP)
	$(BIN)/python -m autograder.execute $(SECTION)

grade: $(STAMP)
	$(BIN)/python -m autograder.grade $(if $(SECTION),--section $(SECTION)) \
		$(if $(STUDENT),--student "$(STUDENT)") $(if $(JOBS),--jobs $(JOBS)) \
		$(if $(DB),--db "$(DB)") $(if $(SHARD),--shard $(SHARD)) $(if $(FORCE),--force) \
		$(if $(RUN_ALL),--run-all)

# After the shards of a class (make grade SHARD=i/n on several machines): grades.csv,
# report.md and grades_lms.csv from the gradebook alone.
grade-report: $(STAMP)
	$(BIN)/python -m autograder.report $(if $(DB),--db "$(DB)")

# Seconds one submission of each section takes (a Run-All of its reference notebook), in
# autograder/section_costs.json: SHARD=i/n balances its shares by them.
section-costs: $(STAMP)
	$(BIN)/python -m autograder.execute --costs-only $(SECTION)

# A demo class graded in a scratch copy of the course: shows the statuses and times grading.
grade-demo: $(STAMP)
	$(BIN)/python -m autograder.demo $(if $(JOBS),--jobs $(JOBS))

# make grade against plain sequential nbgrader and against bare execution, on 24 synthetic
# submissions of the small catalogue assignment; then a class of every section (complete,
# blank, half done) with 1 and 2 jobs against the same notebooks in started processes.
# PART=catalogue or PART=course for one of the two. About 40 minutes; not part of `make test`.
# PART=sections: per section, graded as grading runs it, running every cell, by plain
# nbgrader, and its Run-All (about 15 minutes). PART=class: a 20-student class of every
# section graded with 2 jobs, then 20 resubmissions (about 15 minutes). PART=hub: the course
# server's work after one submission at 10 and 200 students (a minute).
PART ?=
bench-grade: $(STAMP)
	$(BIN)/python -m autograder.bench $(if $(JOBS),--jobs $(JOBS)) $(if $(PART),--part $(PART))

# The self-check's status 1 means "it found something to look at" (it says what), not a
# failure of make: only a notebook it cannot check (status 2) makes the target fail.
check: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make check NB=notebooks/<section>/<name>.ipynb"; exit 2; }
	@$(BIN)/python -m autograder.check "$(NB)"; status=$$?; test $$status -le 1 || exit $$status

# An LMS's bulk download (Canvas or Moodle zip, or its unpacked folder) of one section into
# autograder/submitted/, joined to autograder/roster.csv. TIMES: the LMS's submission times
# (Canvas: the submissions API's JSON or a user_id,submitted_at CSV; Moodle: the grading
# worksheet CSV; several files, space-separated: the API's pages); without them no late
# penalty is taken. KEEP=1 keeps held files that differ.
collect: $(STAMP)
	@test -n "$(FROM)" -a -n "$(SECTION)" || { \
		echo "usage: make collect FROM=<download.zip or folder> SECTION=<section> [LMS=canvas|moodle] [TIMES=<file>] [KEEP=1]"; exit 2; }
	$(BIN)/python -m autograder.collect "$(FROM)" --section "$(SECTION)" \
		$(if $(LMS),--lms $(LMS)) $(foreach t,$(TIMES),--times "$(t)") $(if $(KEEP),--keep)

# nbgrader's formgrader for this course (autograder/README.md, "Scores set by hand"): Jupyter
# started in autograder/ (nbgrader reads autograder/nbgrader_config.py from there) serving
# the repository (the course root must lie under the server's root), with an exchange nbgrader
# can write (its default, /usr/local/share/nbgrader/exchange, logs "Unwritable directory,
# please contact your instructor") and without the students' assignment and course lists.
# EXCHANGE=coursehub/state/exchange shares the course server's. Open the URL it prints.
FORMGRADER_PORT ?= 8890
FORMGRADER_ARGS ?=
EXCHANGE ?= $(CURDIR)/autograder/.work/exchange
FORMGRADER_CONFIG := $(CURDIR)/autograder/.work/formgrader_config
formgrader: $(STAMP)
	@mkdir -p "$(EXCHANGE)" "$(FORMGRADER_CONFIG)"
	@printf 'c = get_config()  # noqa: F821\nc.Exchange.root = "%s"\nc.CourseDirectory.course_id = "distopt"\n' \
		"$(abspath $(EXCHANGE))" > "$(FORMGRADER_CONFIG)/nbgrader_config.py"
	cd autograder && JUPYTER_CONFIG_PATH="$(FORMGRADER_CONFIG)" $(CURDIR)/$(BIN)/jupyter lab \
		--no-browser $(ALLOW_ROOT) --port $(FORMGRADER_PORT) --ServerApp.root_dir="$(CURDIR)" \
		--ServerApp.default_url=/formgrader \
		--ServerApp.jpserver_extensions="{'nbgrader.server_extensions.assignment_list': False, \
			'nbgrader.server_extensions.course_list': False}" $(FORMGRADER_ARGS)

# JupyterLab in headless Chromium (Debian's chromium + chromedriver, installed here on first
# use): every notebook run in the browser, nbgrader's Validate button, a fresh clone's
# `make lab`. About 15 minutes; screenshots in artifacts/screenshots/. CI runs it after `make test`.
test-browser: $(HUB_STAMP)
	e2e/install_browser.sh
	$(BIN)/python -m pytest e2e -q --durations=20 $(PYTEST_ARGS)

# The course server (coursehub/README.md): JupyterHub (pyproject's [hub] extra) and its proxy
# (npm, coursehub/node_modules), a Unix account per student when run as root, nbgrader's
# exchange with notebooks/ released into it, grading on submit. Ctrl-C stops it all.
$(HUB_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[hub]'
	touch $(HUB_STAMP)

hub: $(HUB_STAMP)
	$(BIN)/python -m coursehub.start $(if $(SECTION),--section $(SECTION))

# On a GPU node (docs/instructors.md, "On a GPU node"): every section's reference rank code and tests on
# NCCL, the all-reduce's alpha and bus bandwidth, the trainer's tokens/s and MFU. Without CUDA
# it says so and exits 0. GPU_CHECK_ARGS: e.g. --sections 01_data_parallel --skip-train.
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m autograder.gpu_check $(GPU_CHECK_ARGS)

# Every .py file of the tree: pyproject.toml's [tool.ruff] exclude says what is left out
# (tests/repo/test_coverage.py checks that every tracked .py file is covered).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) autograder/gradebook.db autograder/autograded autograder/feedback \
		autograder/grades.csv autograder/grades_lms.csv autograder/report.md autograder/.work \
		autograder/grades_canvas.csv autograder/grades_moodle.csv autograder/grades_history.csv \
		autograder/gradebook.db.lock autograder/report_figures
