#!/usr/bin/env bash
# The gateway under attack, beside an anchor without, interleaved: a Consul
# dev agent, two Go replicas (20 ms a request) and the gateway with its
# default limits (gateway.New, its Server and AdminServer, as `gpujob gateway
# run`), on loopback; 50 legitimate req/s with a token, open loop, all along;
# in the attack arm, after 3 s, 300 uploads of 10 MB (half trickling at
# 1 KiB/s, half at 128 KiB/s, each starting over 250 ms after it is cut off
# or refused) and 500 slowloris connections for 15 s, then 10 s more of the
# legitimate load alone. Prints a markdown table (median and min-max over the
# rounds) and one JSON line: legitimate success, p99, the gateway's peak RSS,
# and the seconds after the attack until the per-second p99 is back under
# 1.5x the anchor's. No dev cluster; needs the cached Consul (make tools).
# Sources: internal/gateway/benchcmp (attack.go).
#   scripts/bench/gateway-attack.sh [--runs 5] [--json FILE] [--help]
# Every other flag passes through to benchcmp -attack (--legit-rps, --attack-uploads,
# --attack-slowloris, --attack-for, --rss-cap ...; `go run ./internal/gateway/benchcmp -h`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; }
args=(--rounds 5)
while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--runs | --rounds) args+=(--rounds "${2:?$1 needs a number}"); shift 2 ;;
	--runs=* | --rounds=*) args+=(--rounds "${1#*=}"); shift ;;
	--json) j=${2:?--json needs a file}; case $j in /*) ;; *) j=$PWD/$j ;; esac; args+=(--json "$j"); shift 2 ;;
	--json=*) j=${1#--json=}; case $j in /*) ;; *) j=$PWD/$j ;; esac; args+=(--json "$j"); shift ;;
	*) args+=("$1"); shift ;;
	esac
done
cd "$root"
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
# The attackers hold about 800 sockets and the gateway as many.
ulimit -n 65536 2>/dev/null || true
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gateway-attack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"${GO:-go}" build -o "$tmp/benchcmp" ./internal/gateway/benchcmp
"$tmp/benchcmp" -attack "${args[@]}"
