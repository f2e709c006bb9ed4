# Two commands do everything on a fresh machine:
#   make demo   set up, then export -> personalise -> measure on the built-in default
#   make test   set up, then run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
ET     := $(VENV)/bin/edgetrain
DEVICE ?= watchos-extension
USER_ID ?= 10
BATCH  ?= 8
MODEL  ?= patch_mobilenet

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

# seglearn is installed without its dependencies: edgetrain only reads the
# recordings file it ships (pandas/scikit-learn/scipy are never imported).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,dev]'
	$(PY) -m pip install -q --no-deps seglearn==1.2.5
	touch $@

demo: setup
	$(ET) devices
	$(ET) export --model $(MODEL) --holdout-user $(USER_ID) --out artifacts/$(MODEL)
	rm -rf runs/u$(USER_ID)  # the demo starts a fresh run (personalise never overwrites one)
	$(ET) personalise artifacts/$(MODEL) --user $(USER_ID) --device $(DEVICE) --micro-batch $(BATCH) --out runs/u$(USER_ID)
	$(ET) measure artifacts/$(MODEL) --batch $(BATCH) --device $(DEVICE)

test: setup
	$(PY) -m pytest

clean:
	rm -rf artifacts runs .cache
