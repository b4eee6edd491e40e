#!/bin/bash
# nvidia-smi in a guest, with the tracer in front of the guest NVML: every call and its result
# (GPU host; after `make native`).  Output in $OUT/smi-debug.txt.
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
g=$root/build/native/guest
out=${OUT:-$PWD/out}; mkdir -p "$out"
tb=/tmp/nvtrace-guest
"$here/build.sh" "$tb" "$g/libnvidia-ml.so.1" >/dev/null
r=/dev/shm/vmgpu-smi-debug
"$root/build/native/vmgpu-forwarder" --region $r --create 1G --mem 8G --backend cuda 2>"$out/fwd.log" &
f=$!
sleep 3
VMGPU_REGION=$r LD_LIBRARY_PATH=$g python3 -c 'import sys, torch; x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); print("held", flush=True); sys.stdin.read()' < <(sleep 60) &
h=$!
VMGPU_REGION=$r LD_LIBRARY_PATH=$g "$root/build/native/hold" 256 < <(sleep 60) &
sleep 10
for a in "" "-L" "--query-gpu=name,memory.total,memory.used --format=csv" "--query-compute-apps=pid,process_name,used_memory --format=csv" "-q"; do
	echo "=== nvidia-smi $a"
	VMGPU_REGION=$r NVT_VERBOSE=1 NVT_REAL=$g/libnvidia-ml.so.1 LD_LIBRARY_PATH=$tb:$g nvidia-smi $a 2>&1
	echo "rc=$?"
done >"$out/smi-debug.txt"
kill $h $f; wait
