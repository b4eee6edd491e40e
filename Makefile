# vmgpu build.  `make` builds the native parts; `make test` runs every test;
# `make selftest` runs the transport end to end on this host.
BUILD := build
NATIVE := $(BUILD)/native
VENV := .venv
PYTHON ?= $(VENV)/bin/python

# cuda.h, nvcc and ptxas: the CUDA toolkit's where one is installed, else NVIDIA's wheels (the
# `cuda` extra, pinned in pyproject.toml) in the virtual environment, which `make venv` then
# installs and links as $(VENV)/cuda (their nvidia/cu13: bin/, include/, lib/, nvvm/).
PIP_CUDA := $(abspath $(VENV))/cuda
CUDA_INCLUDE ?= $(if $(wildcard /usr/local/cuda/include/cuda.h),/usr/local/cuda/include,$(PIP_CUDA)/include)
# nvml.h, for the guest's libnvidia-ml.so.1: the toolkit's, or NVIDIA's nvidia-nvml-dev wheel (pinned
# in pyproject.toml) from the virtual environment where the toolkit has none.
NVML_INCLUDE ?= $(if $(wildcard $(CUDA_INCLUDE)/nvml.h),$(CUDA_INCLUDE),$(abspath $(VENV))/nvml-include)
# the wheel's nvcc finds its headers, cicc and ptxas itself, but not its lib/ (static cudart)
NVCC ?= $(or $(shell command -v nvcc),$(wildcard /usr/local/cuda/bin/nvcc),$(PIP_CUDA)/bin/nvcc -L$(PIP_CUDA)/lib)
PTXAS ?= $(or $(shell command -v ptxas),$(wildcard /usr/local/cuda/bin/ptxas),$(PIP_CUDA)/bin/ptxas)
# the venv's extras: the CUDA wheels where the build uses them; libvirt-python (built against
# libvirt-dev, for `vmgpu vm` and its tests): LIBVIRT=auto installs it where libvirt-dev and
# pkg-config are there, LIBVIRT=yes insists (CI: the libvirt tests must run), LIBVIRT=no leaves it out.
LIBVIRT ?= auto
VENV_EXTRAS ?= test$(if $(findstring $(PIP_CUDA),$(CUDA_INCLUDE) $(NVCC) $(PTXAS)),$(comma)cuda)$(if $(filter \
	yes,$(LIBVIRT))$(if $(filter auto,$(LIBVIRT)),$(shell pkg-config --exists libvirt 2>/dev/null && echo y)),$(comma)libvirt)
comma := ,

.PHONY: all demo native wheel native-asan native-tsan venv test fuzz bench bench-transport bench-remoting bench-pytorch bench-remote bench-isolation bench-sharing selftest lint clean \
	gen gen-check cuda-programs proto census

all: native

# A virtual environment with vmgpu (editable) and its test tools, pinned in pyproject.toml
# (extras: VENV_EXTRAS above).
venv: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[$(VENV_EXTRAS)]'
	$(if $(findstring cuda,$(VENV_EXTRAS)),ln -sfn "$$($(PYTHON) -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')" $(PIP_CUDA))
	touch $@

# cuda.h from the venv's wheel (a toolkit's is there already)
$(PIP_CUDA)/include/cuda.h: $(VENV)/.stamp
	test -f $@

# The wheel to install on a host (`pip install build/dist/vmgpu-*.whl`: `vmgpu` and the native
# programs, in vmgpu/_native/), built from the sdist beside it, which builds the native parts and,
# with this build's nvcc, the demo's vecadd_ptx.
wheel: venv
	rm -rf $(BUILD)/dist
	$(PYTHON) -m build --sdist --outdir $(BUILD)/dist .
	NVCC='$(NVCC)' $(PYTHON) -m pip wheel -q --no-deps --wheel-dir $(BUILD)/dist $(BUILD)/dist/vmgpu-*.tar.gz

selftest: native venv
	$(VENV)/bin/vmgpu region selftest

# The main job: unchanged CUDA programs through vmgpu on this host (its GPU, or the
# simulated backend where there is none, which it says).
demo: native cuda-programs venv
	$(VENV)/bin/vmgpu region selftest
	$(VENV)/bin/vmgpu demo

# The transport, the guest's libcuda.so.1, the forwarder and the simulated backend,
# and the driver-API test program.
native: $(NVML_INCLUDE)/nvml.h $(CUDA_INCLUDE)/cuda.h
	$(MAKE) -C native/shm_transport O=$(abspath $(NATIVE)) SAN=none
	$(MAKE) -C guest_agent O=$(abspath $(NATIVE)) CUDA_INCLUDE=$(CUDA_INCLUDE) NVML_INCLUDE=$(NVML_INCLUDE)
	$(MAKE) -C host_forwarder O=$(abspath $(NATIVE)) CUDA_INCLUDE=$(CUDA_INCLUDE)
	$(CC) -O1 -g -Wall -o $(NATIVE)/drv_api tests/cuda/drv_api.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/hold tests/cuda/hold.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/multi tests/cuda/multi.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/spin tests/cuda/spin.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/blocking_order tests/cuda/blocking_order.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/memquota tests/cuda/memquota.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/reuse tests/cuda/reuse.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/hostfn tests/cuda/hostfn.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/graphs_explicit tests/cuda/graphs_explicit.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/ipc_pair tests/cuda/ipc_pair.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/vmm_fd_pair tests/cuda/vmm_fd_pair.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/copy2d tests/cuda/copy2d.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/link tests/cuda/link.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/jit_load tests/cuda/jit_load.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda
	$(CC) -O1 -g -Wall -o $(NATIVE)/memprobe bench/memprobe.c -I$(CUDA_INCLUDE) -L$(NATIVE)/guest -lcuda -ldl
	$(if $(OPENSSL),$(CC) $(NETBRIDGE_CFLAGS) -o $(NATIVE)/vmgpu-netbridge native/net_bridge/netbridge.c \
		-Inative/shm_transport/include $(NATIVE)/libvmgpushm.a $(OPENSSL) -lpthread,\
		@echo "vmgpu-netbridge not built: no OpenSSL (apt-get install libssl-dev pkg-config)")

# vmgpu-netbridge (a guest's region over TLS to another host's forwarder) needs OpenSSL 3.
OPENSSL ?= $(shell pkg-config --libs openssl 2>/dev/null)
NETBRIDGE_CFLAGS := -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes

# Unchanged CUDA runtime programs (nvcc, static cudart), for the differential tests.
# vecadd_ptx carries its kernel as uncompressed PTX, which the simulated backend can run.
cuda-programs: native
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/vecadd tests/cuda/vecadd.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/matmul tests/cuda/matmul.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/streams tests/cuda/streams.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/devquery tests/cuda/devquery.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/oob tests/cuda/oob.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/free_reuse tests/cuda/free_reuse.cu
	$(PTXAS) -arch=sm_90 -o $(NATIVE)/vadd.cubin tests/cuda/vadd.ptx
	$(PTXAS) -c -arch=sm_90 -o $(NATIVE)/vadd_rdc.cubin tests/cuda/vadd.ptx
	$(NVCC) -cubin -arch=sm_90 -o $(NATIVE)/bigglobal.cubin tests/cuda/bigglobal.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/bench_remoting bench/bench_remoting.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/isolation bench/isolation.cu
	$(NVCC) -O2 -arch=sm_90 -o $(NATIVE)/green_launch bench/green_launch.cu -L$(NATIVE)/guest -lcuda
	$(NVCC) -O2 -gencode arch=compute_90,code=compute_90 -no-compress -o $(NATIVE)/vecadd_ptx tests/cuda/vecadd.cu

# The CUDA API spec drives generated code on both sides; CI fails if it is stale.
gen: $(NVML_INCLUDE)/nvml.h $(CUDA_INCLUDE)/cuda.h
	python3 native/cuda_api/gen.py --cuda-include $(CUDA_INCLUDE)
	python3 guest_agent/nvml/gen_nvml.py --nvml-include $(NVML_INCLUDE)

$(abspath $(VENV))/nvml-include/nvml.h: $(VENV)/.stamp
	mkdir -p $(dir $@)
	cp "$$($(PYTHON) -c 'import importlib.metadata as m; print(next(f.locate() for f in m.files("nvidia-nvml-dev") if f.name == "nvml.h"))')" $@

# vmgpud's gRPC modules, from vmgpu/api/v1/vmgpu.proto (committed).
proto: venv
	$(PYTHON) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. vmgpu/api/v1/vmgpu.proto

gen-check: $(NVML_INCLUDE)/nvml.h $(CUDA_INCLUDE)/cuda.h
	python3 native/cuda_api/gen.py --check --cuda-include $(CUDA_INCLUDE)
	python3 guest_agent/nvml/gen_nvml.py --check --nvml-include $(NVML_INCLUDE)

native-asan:
	$(MAKE) -C native/shm_transport O=$(abspath $(BUILD)/asan) SAN=asan
	$(MAKE) -C host_forwarder O=$(abspath $(BUILD)/asan) CUDA_INCLUDE=$(CUDA_INCLUDE) \
		EXTRA_CFLAGS="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -DVH_CHECKED" \
		EXTRA_LDFLAGS="-fsanitize=address,undefined"
	$(if $(OPENSSL),$(CC) $(NETBRIDGE_CFLAGS) -O1 -fno-omit-frame-pointer -fsanitize=address$(comma)undefined \
		-fno-sanitize-recover=all -o $(BUILD)/asan/vmgpu-netbridge native/net_bridge/netbridge.c \
		-Inative/shm_transport/include $(BUILD)/asan/libvmgpushm.a $(OPENSSL) -lpthread)

native-tsan:
	$(MAKE) -C native/shm_transport O=$(abspath $(BUILD)/tsan) SAN=tsan

# The whole suite: native test programs (plain, ASan/UBSan, TSan), the bounded
# fuzz run, the Python tests, and `make lint` first.  This is what CI runs.
# The pool's tests run in a pytest process of their own: they fork (pyroute2's namespaces, each
# process they start in one), and a process that other tests left with gRPC's threads can hang
# in fork() (seen once in CI: the lab stuck in os.fork while building its network).
test: gen-check lint native native-asan native-tsan cuda-programs venv
	CUDA_INCLUDE=$(CUDA_INCLUDE) NVML_INCLUDE=$(NVML_INCLUDE) $(PYTHON) -m pytest tests --ignore=tests/pool
	CUDA_INCLUDE=$(CUDA_INCLUDE) NVML_INCLUDE=$(NVML_INCLUDE) $(PYTHON) -m pytest tests/pool

# Bounded fuzzing of the host side in the ASan/UBSan build (FUZZ_SECONDS, default 60).
FUZZ_SECONDS ?= 60
fuzz: native-asan
	$(BUILD)/asan/tests/fuzz_host $(FUZZ_SECONDS)

bench-transport: native
	@mkdir -p $(BUILD)/bench
	$(NATIVE)/bench_transport | tee $(BUILD)/bench/transport.txt

# vmgpu against native in the same run, on this host's GPU (the GPU host).
bench-remoting: cuda-programs
	@mkdir -p $(BUILD)/bench
	python3 bench/run_remoting.py | tee $(BUILD)/bench/remoting.txt

# unchanged PyTorch natively and through vmgpu (ResNet-50 fp32/bf16, a GPT step, its CUDA graph)
bench-pytorch: cuda-programs
	@mkdir -p $(BUILD)/bench
	python3 bench/run_torch.py --stats $(BUILD)/bench | tee $(BUILD)/bench/pytorch.txt

# a guest whose GPU is on "another host": this one over loopback TCP through vmgpu-netbridge (TLS)
# against native; a host built without OpenSSL reports remote=missing in the summary
bench-remote: cuda-programs
	@mkdir -p $(BUILD)/bench
	-python3 bench/run_remote.py | tee $(BUILD)/bench/remote.txt

# compute isolation: N guests under the weighted and fixed policies, caps, convergence, overhead
bench-isolation: cuda-programs
	@mkdir -p $(BUILD)/bench
	python3 bench/run_isolation.py | tee $(BUILD)/bench/isolation.txt

# tenants' throughput shares, priority and caps beside the no-sched and MPS references
bench-sharing: cuda-programs
	@mkdir -p $(BUILD)/bench
	python3 bench/run_sharing.py --prio-reserve 30 | tee $(BUILD)/bench/sharing.txt

# every GPU test program natively under the driver-call census (CENSUS_DIR: the census tool's
# directory, built into build/census/): what each uses that vmgpu does not serve (CENSUS_ARGS: e.g. --strict)
CENSUS_DIR ?= ../shared/tools/census
census: cuda-programs
	python3 bench/census.py --census-dir '$(CENSUS_DIR)' $(CENSUS_ARGS)

# the last line joins the summaries: remoting overheads, the PyTorch ratios, the remote rows
bench: bench-transport bench-remoting bench-pytorch bench-remote
	@python3 bench/summary.py $(BUILD)/bench

lint: venv
	$(PYTHON) -m ruff check vmgpu tests bench native/cuda_api guest_agent/nvml tools
	$(PYTHON) -m ruff format --check vmgpu tests bench native/cuda_api guest_agent/nvml tools

clean:
	rm -rf $(BUILD) $(VENV)
