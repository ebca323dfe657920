#!/usr/bin/env bash
# The real-NVML checks, for a machine with an NVIDIA GPU (the device tool's
# GPU machine, or any GPU host): builds the nvml test binary and runs the
# real-backend test (devices, attributes, stats, health, events, printed with
# -v) and the real stats latency per device. Writes the output to
# ${OUT:-.}/gpu-check.log. Needs Go and gcc; nothing else.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$repo}/gpu-check.log
cd "$repo"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
{
	echo "== $(date -u +%FT%TZ) $(uname -srm)"
	command -v nvidia-smi >/dev/null && nvidia-smi -L
	go test -c -o /tmp/nvml.test ./device/nvml
	/tmp/nvml.test -test.run 'TestRealNVML' -test.v
	/tmp/nvml.test -test.run '^$' -test.bench 'ReadRealNVML|Read8' -test.benchmem -test.count 3
} 2>&1 | tee "$out"
