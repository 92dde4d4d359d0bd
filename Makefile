# Two commands for a newcomer: `make sweep` (the main job) and `make test` (the tests).
# Both bootstrap a local .venv from pyproject.toml the first time.  On the cpu lane `make sweep`
# runs the quick profile (every check and every required negative control, the fast kernel on a
# few cases per component: minutes); `make sweep-full` runs every case (about an hour on 2 cores).
# On GPU lanes both run every case of the fast kernels and of the required negative controls;
# `make sweep` runs the baselines that decide nothing there (pin candidates, controls not
# required on the lane) on their quick cases only, `make sweep-full` on every case.
#
# On a machine whose python already has a CUDA torch and triton (the H200 image), skip the venv:
#   make sweep PY=python3        (installs batchinv into that python with --no-deps first)

PY ?= .venv/bin/python
# torch for the venv, installed first so the project's "torch>=2.11,<2.16" is already satisfied.  The
# default resolves to a local CPU wheel on this workplace's machines; elsewhere, without a GPU,
# use TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" (README).
TORCH_SPEC ?= torch==2.13.0
# Triton for the venv: the version the GPU lanes are validated on (the H200 image's), with the
# numpy its interpreter needs (Triton 3.6's cpu lane fails with numpy >= 2.4; fast/versions.py).
# The project accepts Triton 3.6-3.9: ci/compat.sh runs the cpu lane on each.
TRITON_SPEC ?= triton==3.6.0 numpy<2.4
PYTEST_ARGS ?= -n auto --dist loadgroup
SWEEP_ARGS ?=

# `make report`: the newest reports/sweep-*.jsonl (what `make sweep` writes) as one HTML page beside
# it; REPORT_ARGS=PATH.jsonl picks another, REPORT_ARGS="--bench PREFIX.json" adds a bench report.
REPORT_ARGS ?=

.PHONY: sweep sweep-full test lint bench report clean

ifeq ($(PY),.venv/bin/python)
STAMP := .venv/.installed
$(STAMP): pyproject.toml
	python3 -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip
	.venv/bin/python -m pip install -q $(TORCH_SPEC)
	.venv/bin/python -m pip install -q $(foreach spec,$(TRITON_SPEC),'$(spec)')
	.venv/bin/python -m pip install -q -e '.[dev,models]'
	touch $(STAMP)
else
STAMP := .stamp-$(notdir $(PY))
$(STAMP): pyproject.toml
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)
endif

sweep: $(STAMP)
	$(PY) -m batchinv.harness.cli sweep $(SWEEP_ARGS)

sweep-full: $(STAMP)
	$(PY) -m batchinv.harness.cli sweep --profile full $(SWEEP_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy harness reference

bench: $(STAMP)
	$(PY) -m batchinv.harness.cli bench

report: $(STAMP)
	$(PY) -m batchinv.harness.cli report $(REPORT_ARGS)

clean:
	rm -rf .venv .stamp-* build *.egg-info
