#!/bin/sh
# Build the export-table probe into $1 (a directory); prints the library's path.
set -e
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
gcc -O1 -g -Wall -Wextra -shared -fPIC -o "$1/libxprobe.so" "$here/export_probe.c" "$here/trampolines.S" -ldl -lpthread
echo "$1/libxprobe.so"
