#!/bin/sh
# Build the NVML tracing library into $1 (a directory), for the library $2 (default: this host's
# real libnvidia-ml.so.1); prints the traced library's path last.
set -e
out=$1
real=${2:-$(ldconfig -p | awk '/libnvidia-ml.so.1 .*x86-64/ {print $NF; exit}')}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
nm -D --defined-only "$real" | awk '$2 == "T" || $2 == "W" || $2 == "i" {print $3}' | sed 's/@.*//' | sort -u >"$out/exports.txt"
cd "$out" && python3 "$here/gen.py" exports.txt
gcc -O2 -shared -fPIC -I"$out" -o "$out/libnvidia-ml.so.1" "$here/nvtrace.c" "$out/stubs.S" "$out/slots.S" -ldl -Wl,-soname,libnvidia-ml.so.1
echo "$real"
