#!/usr/bin/env bash
# Search quality, side by side in one run: gpujob's TPE and Random
# (internal/sweep/search) vs Optuna's TPESampler and RandomSampler (Debian's
# python3-optuna, /usr/bin/python3) on synthetic objectives (a log-lr bowl with
# a categorical and a noisy floor, Branin with an int param, a 4-D mixed space),
# seeds 0..K-1 interleaved, N = 20 and 50 sequential trials, no pruning. Prints
# markdown tables (median and min-max over the seeds of regret and best value);
# see BenchmarkSearchQualityVsOptuna in internal/sweep/search/quality_bench_test.go.
# Needs Go; without Optuna the benchmark skips and says why. No cluster.
#   scripts/bench/search-quality.sh [--seeds 50] [--json FILE] [--help]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seeds=50
json=
usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }
while [ $# -gt 0 ]; do
	case $1 in
	--seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
	--seeds=*) seeds=${1#--seeds=}; shift ;;
	--json) json=${2:?--json needs a file}; shift 2 ;;
	--json=*) json=${1#--json=}; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "search-quality.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
	esac
done
case $seeds in '' | *[!0-9]* | 0) echo "search-quality.sh: --seeds wants a positive integer, got '$seeds'" >&2; exit 2 ;; esac
if [ -n "$json" ]; then
	case $json in /*) ;; *) json=$PWD/$json ;; esac
fi
cd "$root"
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
GPUJOB_QUALITY_SEEDS=$seeds GPUJOB_QUALITY_JSON=$json exec "${GO:-go}" test -v -count=1 -run '^$' \
	-bench '^BenchmarkSearchQualityVsOptuna$' -benchtime 1x ./internal/sweep/search/
