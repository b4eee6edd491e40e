# vmgpu build.  `make` builds the native parts; `make test` runs every test;
# `make selftest` runs the transport end to end on this host.
BUILD := build
NATIVE := $(BUILD)/native
VENV := .venv
PYTHON ?= $(VENV)/bin/python

.PHONY: all native native-asan native-tsan venv test fuzz bench bench-transport selftest lint clean

all: native

# A virtual environment with vmgpu (editable) and its test tools, pinned in pyproject.toml.
venv: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

selftest: native venv
	$(VENV)/bin/vmgpu region selftest

native:
	$(MAKE) -C native/shm_transport O=$(abspath $(NATIVE)) SAN=none

native-asan:
	$(MAKE) -C native/shm_transport O=$(abspath $(BUILD)/asan) SAN=asan

native-tsan:
	$(MAKE) -C native/shm_transport O=$(abspath $(BUILD)/tsan) SAN=tsan

# The whole suite: native test programs (plain, ASan/UBSan, TSan), the bounded
# fuzz run, and the Python tests.  This is what CI runs.
test: native native-asan native-tsan venv
	$(PYTHON) -m pytest tests

# Bounded fuzzing of the host side in the ASan/UBSan build (FUZZ_SECONDS, default 60).
FUZZ_SECONDS ?= 60
fuzz: native-asan
	$(BUILD)/asan/tests/fuzz_host $(FUZZ_SECONDS)

bench-transport: native
	@mkdir -p $(BUILD)/bench
	$(NATIVE)/bench_transport | tee $(BUILD)/bench/transport.txt

bench: bench-transport

lint: venv
	$(PYTHON) -m ruff check vmgpu tests
	$(PYTHON) -m ruff format --check vmgpu tests

clean:
	rm -rf $(BUILD) $(VENV)
