#!/bin/bash
# Which NVML export tables nvidia-smi asks for and which of their slots it calls (GPU host).
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"
tb=/tmp/nvtrace
real=$("$here/build.sh" "$tb" | tail -1)
python3 - >/dev/null 2>&1 <<'PY' &
import torch, time
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
time.sleep(25)
PY
sleep 8
for a in "" "-L" "--query-gpu=name,memory.total,memory.used --format=csv" "--query-compute-apps=pid,process_name,used_memory --format=csv"; do
	echo "=== nvidia-smi $a"; NVT_REAL=$real LD_LIBRARY_PATH=$tb nvidia-smi $a 2>&1
done >"$out/tables.txt"
wait
