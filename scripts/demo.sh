#!/usr/bin/env bash
# `make demo`: start the local dev cluster (fake GPUs when the machine has no
# NVIDIA driver), show the GPUs Nomad sees, run a job that asks for them and
# print what each allocation was given. The cluster stays up for a look
# around; `make dev-down` stops it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"

dir=$(gpujob_dev_dir)
if [ -f "$dir/env" ] && curl -fsS "$(. "$dir/env"; echo "$NOMAD_ADDR")/v1/status/leader" >/dev/null 2>&1; then
	log "reusing the dev cluster in $dir"
else
	"$here/dev-up.sh"
fi
# shellcheck disable=SC1091
. "$dir/env"
nomad=$(gpujob_nomad_bin)

# wait_done JOB blocks on Nomad's job summary (a blocking query: it answers
# when the summary changes) until no allocation is queued, starting or running.
wait_done() {
	local index=0 deadline=$((SECONDS + 120)) headers summary
	headers=$(mktemp)
	while ((SECONDS < deadline)); do
		summary=$(curl -fsS -D "$headers" "$NOMAD_ADDR/v1/job/$1/summary?index=$index&wait=10s")
		index=$(awk 'tolower($1) == "x-nomad-index:" { print $2 }' "$headers" | tr -d '\r')
		if jq -e '[.Summary[] | .Queued + .Starting + .Running] | add == 0' <<<"$summary" >/dev/null; then
			rm -f "$headers"
			return 0
		fi
	done
	rm -f "$headers"
	die "job $1 did not finish within 120 s: $("$nomad" job status "$1" | tail -5)"
}

log "GPUs the cluster sees (nomad node status -verbose):"
for node in $("$nomad" node status -quiet); do
	"$nomad" node status -verbose "$node" | sed -n '/^Device Resource Utilization/,/^$/p'
done

job=$repo/jobspecs/examples/gpu-hello.nomad.hcl
log "running $job"
"$nomad" job run "$job"
wait_done gpu-hello

log "what each allocation was given:"
for alloc in $("$nomad" job allocs -t '{{range .}}{{.ID}} {{end}}' gpu-hello); do
	"$nomad" alloc logs "$alloc" hello
done

cat <<MSG

Look further:
  source $dir/env
  $nomad node status -stats \$($nomad node status -quiet | head -1)   # GPU stats
  $nomad job status gpu-hello
  Nomad UI: $NOMAD_ADDR/ui     Consul UI: http://$CONSUL_HTTP_ADDR/ui
Stop the cluster: make dev-down
MSG
