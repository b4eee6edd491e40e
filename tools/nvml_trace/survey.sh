#!/bin/bash
# What the real NVML exports and what nvidia-smi, pynvml and PyTorch call of it (run on the GPU host).
# Writes into $OUT (or ./out): exports.txt, trace-*.tsv (count<TAB>function), and the programs' output.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/out}
mkdir -p "$out"
tb=/tmp/nvtrace
real=$("$here/build.sh" "$tb" | tail -1)
cp "$tb/exports.txt" "$out/exports.txt"
{
	echo "real: $real"; ls -l "$real"*; readlink -f "$real"
	wc -l <"$tb/exports.txt"
	command -v nvidia-smi; ldd "$(command -v nvidia-smi)"; nvidia-smi --version
	ls /usr/local/cuda*/include/nvml.h /usr/include/nvml.h 2>&1
	python3 -c 'import pynvml, importlib.metadata as m; print("nvidia-ml-py", m.version("nvidia-ml-py"))'
	command -v strace ltrace gdb
} >"$out/facts.txt" 2>&1
for h in /usr/local/cuda*/include/nvml.h; do [ -f "$h" ] && cp "$h" "$out/nvml.h" && break; done
python3 - >/dev/null 2>&1 <<'PY' &
import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
time.sleep(40)
PY
holder=$!
sleep 8
t() { local name=$1; shift; NVT_REAL=$real NVT_OUT=$out/trace-$name.tsv LD_LIBRARY_PATH=$tb "$@" >"$out/out-$name.txt" 2>&1; echo "rc=$?" >>"$out/out-$name.txt"; }
t smi nvidia-smi
t smi-L nvidia-smi -L
t smi-qgpu nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw,clocks.sm,compute_mode --format=csv
t smi-qapps nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv
t smi-q nvidia-smi -q
t pynvml python3 -c '
import pynvml as n
n.nvmlInit(); c = n.nvmlDeviceGetCount(); h = n.nvmlDeviceGetHandleByIndex(0)
print(c, n.nvmlDeviceGetName(h), n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetMemoryInfo(h).total, n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used)
print(n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetTemperature(h, 0), n.nvmlDeviceGetPowerUsage(h))
print([(p.pid, p.usedGpuMemory) for p in n.nvmlDeviceGetComputeRunningProcesses(h)])
print(n.nvmlDeviceGetCudaComputeCapability(h), n.nvmlSystemGetDriverVersion(), n.nvmlSystemGetCudaDriverVersion_v2())
print(n.nvmlDeviceGetPciInfo(h).busId, n.nvmlDeviceGetIndex(h), n.nvmlDeviceGetMinorNumber(h))
n.nvmlShutdown()'
t torch python3 -c '
import torch
x = torch.ones(1 << 20, device="cuda")
print(torch.cuda.device_memory_used(), torch.cuda.utilization(), torch.cuda.memory_usage() if hasattr(torch.cuda,"memory_usage") else None)
print(torch.cuda.list_gpu_processes())
print(torch.cuda.temperature(), torch.cuda.power_draw(), torch.cuda.clock_rate())'
t vllm python3 -c '
import pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
print([pynvml.nvmlDeviceGetName(h) for h in hs], [pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in hs])
print(pynvml.nvmlDeviceGetMemoryInfo(hs[0]).total)
pynvml.nvmlShutdown()'
kill $holder 2>/dev/null; wait $holder 2>/dev/null
# without the real library (every call but init refused) and without /dev/nvidia*: does nvidia-smi get to NVML?
unshare -m --propagation private sh -c 'for f in /dev/nvidia*; do if [ -d "$f" ]; then mount -t tmpfs -o ro,mode=0 none "$f"; else mount --bind /dev/null "$f"; fi; done; LD_LIBRARY_PATH='$tb' nvidia-smi; echo rc=$?; LD_LIBRARY_PATH='$tb' nvidia-smi -L; echo rc=$?; LD_LIBRARY_PATH='$tb' nvidia-smi --query-gpu=name,memory.total --format=csv; echo rc=$?' >"$out/fake-smi.txt" 2>&1
LD_DEBUG=libs nvidia-smi -L 2>&1 | grep -i "nvidia-ml" | head -5 >"$out/ld-debug.txt"
