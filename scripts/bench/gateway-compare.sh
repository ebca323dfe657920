#!/usr/bin/env bash
# The gateway vs HAProxy vs going direct, side by side in one run: two Go
# replicas that take 20 ms per request, registered in a Consul dev agent with
# a route and a token in KV; 64 closed-loop keep-alive connections to them
# directly, through the gateway (gateway.New + Run + http.Server, as `gpujob
# gateway run`) and through HAProxy 2.6 (balance leastconn, same replicas),
# arms interleaved and rotated per round; then the pool update time after a
# replica's check turns critical. Prints a markdown table and one JSON line
# (median and min-max over the rounds). No dev cluster; needs the cached
# Consul (make tools) and Debian's haproxy, installed here when run as root,
# else the HAProxy arm is skipped. Sources: internal/gateway/benchcmp.
#   scripts/bench/gateway-compare.sh [--rounds 5 | --runs 5] [--duration 5s] [--json FILE] [--profile DIR] [--help]
# Every other flag of benchcmp passes through (--conns, --pool-reps, --pin 0:1, --haproxy none,
# --alt-gateway BIN ...): scripts/bench/gateway-compare.sh -h lists this, `go run ./internal/gateway/benchcmp -h` those.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '2,14s/^# \{0,1\}//p' "$0"; }
args=()
json=
profile=
haproxy_given=
while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--haproxy | -haproxy | --haproxy=* | -haproxy=*) haproxy_given=1; args+=("$1"); shift ;;
	--runs) args+=(--rounds "${2:?--runs needs a number}"); shift 2 ;; # the other harnesses' name
	--runs=*) args+=(--rounds "${1#--runs=}"); shift ;;
	--json) json=${2:?--json needs a file}; shift 2 ;;
	--json=*) json=${1#--json=}; shift ;;
	--profile) profile=${2:?--profile needs a directory}; shift 2 ;;
	--profile=*) profile=${1#--profile=}; shift ;;
	*) args+=("$1"); shift ;;
	esac
done
# Paths relative to where the script was called from.
if [ -n "$json" ]; then
	case $json in /*) ;; *) json=$PWD/$json ;; esac
	args+=(--json "$json")
fi
if [ -n "$profile" ]; then
	case $profile in /*) ;; *) profile=$PWD/$profile ;; esac
	args+=(--profile "$profile")
fi

haproxy_bin=$(command -v haproxy || true)
if [ -n "$haproxy_given" ]; then
	: # --haproxy BIN (or none) given: benchcmp uses it as is
elif [ -z "$haproxy_bin" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "gateway-compare.sh: installing Debian's haproxy" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >&2 ||
			{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >&2; } || true
		haproxy_bin=$(command -v haproxy || true)
	fi
fi
if [ -z "$haproxy_bin" ]; then
	echo "gateway-compare.sh: no haproxy binary (apt-get install haproxy, as root): the HAProxy arm is SKIPPED" >&2
	args+=(--haproxy none)
fi
if [ -z "$haproxy_given" ] && [ -n "$haproxy_bin" ]; then
	args+=(--haproxy "$haproxy_bin")
fi

cd "$root"
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gateway-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"${GO:-go}" build -o "$tmp/benchcmp" ./internal/gateway/benchcmp
# Not exec: the trap removes the binary afterwards. benchcmp stops its
# children (Consul, the replicas, the gateway, HAProxy) however it ends.
"$tmp/benchcmp" "${args[@]}"
