#!/usr/bin/env bash
# The driver's overhead on training: the workload's throughput (samples/s,
# from its result line) started by the gpujob driver on a dev cluster vs the
# same script started by hand with the same environment, alternating
# hand/driver RUNS times each in one run. Prints both medians and the ratio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/lib.sh"

runs=${RUNS:-3}
args=(--steps 300 --checkpoint-every 0 --no-resume --log-every 50)
workload=$repo/jobspecs/workloads/bert_finetune.py
export GPUJOB_DEV_DIR=${GPUJOB_BENCH_DEV_DIR:-/tmp/gpujob-bench-overhead}
export GPUJOB_DEV_PORT_OFFSET=${GPUJOB_DEV_PORT_OFFSET:-40000}

"$repo/scripts/dev-up.sh" >/dev/null
trap '"$repo/scripts/dev-down.sh" >/dev/null' EXIT
# shellcheck disable=SC1091
. "$GPUJOB_DEV_DIR/env"
nomad=$(gpujob_nomad_bin)
scratch=$(mktemp -d)
trap '"$repo/scripts/dev-down.sh" >/dev/null; rm -rf "$scratch"' EXIT

result_sps() { sed -n 's/^gpujob-result: //p' | jq -r '.samples_per_sec'; }

by_hand() {
	RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 \
		OMP_NUM_THREADS=1 GPUJOB_CHECKPOINT_DIR="$scratch/hand" \
		/usr/bin/python3 "$workload" "${args[@]}" | result_sps
}

by_driver() {
	local job=bench-overhead-$1 alloc
	"$nomad" job run -detach -var workers=1 -var gpus_per_worker=1 -var "workload=$workload" \
		-var "args=$(jq -cn '$ARGS.positional' --args -- "${args[@]}")" \
		<(sed "s/^job \"bert-finetune\"/job \"$job\"/" "$repo/jobspecs/bert-finetune.nomad.hcl") >/dev/null
	# Block on the job summary until the allocation is done.
	local index=0 headers
	headers=$(mktemp)
	while :; do
		summary=$(curl -fsS -D "$headers" "$NOMAD_ADDR/v1/job/$job/summary?index=$index&wait=30s")
		index=$(awk 'tolower($1) == "x-nomad-index:" { print $2 }' "$headers" | tr -d '\r')
		jq -e '[.Summary[] | .Queued + .Starting + .Running] | add == 0' <<<"$summary" >/dev/null && break
	done
	rm -f "$headers"
	alloc=$("$nomad" job allocs -t '{{range .}}{{.ID}}{{end}}' "$job")
	"$nomad" alloc logs "$alloc" train | result_sps
	"$nomad" job stop -purge "$job" >/dev/null
}

hand=() driver=()
for ((i = 1; i <= runs; i++)); do
	hand+=("$(by_hand)")
	driver+=("$(by_driver "$i")")
	log "run $i: by hand ${hand[-1]} samples/s, under the driver ${driver[-1]} samples/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
h=$(median "${hand[@]}") d=$(median "${driver[@]}")
awk -v h="$h" -v d="$d" -v n="$runs" 'BEGIN { printf "| by hand | under the driver | ratio (driver / hand) |\n| --- | --- | --- |\n| %.0f samples/s | %.0f samples/s | %.3f |\n(median of %d alternating runs)\n", h, d, d / h, n }'
