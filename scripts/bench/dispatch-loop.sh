#!/usr/bin/env bash
# dispatch-loop.sh PARENT N PARALLEL: the anchor of sweep-overhead.sh, what a
# user writes by hand instead of a sweep. It dispatches N jobs of the
# registered parameterized job PARENT (`nomad job dispatch -meta x=I`, I = 1..N),
# keeping PARALLEL of them in flight (pending or running), and returns once all
# N are dead. It waits without polling: a Nomad blocking query on PARENT's job
# summary, whose Children counts (Pending, Running, Dead) change in the same
# Raft write as a child's status, wakes it as soon as a child ends.
# Needs NOMAD_ADDR (NOMAD_BIN: the nomad CLI, else nomad on PATH), curl and jq.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PARENT N PARALLEL" >&2; exit 2; }
parent=$1 n=$2 parallel=$3
nomad=${NOMAD_BIN:-nomad}
hdr=$(mktemp)
trap 'rm -f "$hdr"' EXIT

index=0 inflight=0 dead=0
# wait_until COND blocks until the parent's children satisfy COND, an
# arithmetic expression over $inflight and $dead.
wait_until() {
	local body
	while :; do
		body=$(curl -sfS --max-time 90 -D "$hdr" \
			"$NOMAD_ADDR/v1/job/$parent/summary?index=$index&wait=60s")
		index=$(tr -d '\r' <"$hdr" | awk -F': ' 'tolower($1) == "x-nomad-index" { print $2 }')
		read -r inflight dead < <(jq -r '.Children | "\(.Pending + .Running) \(.Dead)"' <<<"$body")
		if (("$1")); then
			return 0
		fi
	done
}

for ((i = 1; i <= n; i++)); do
	wait_until "inflight < parallel"
	"$nomad" job dispatch -detach -meta "x=$i" "$parent" >/dev/null
done
wait_until "dead >= n"
