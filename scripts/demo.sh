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

log "GPUs the cluster sees (nomad node status -verbose):"
for node in $("$nomad" node status -quiet); do
	"$nomad" node status -verbose "$node" | sed -n '/^Device Resource Utilization/,/^$/p'
done

job=$repo/jobspecs/examples/gpu-hello.nomad.hcl
log "running $job"
"$nomad" job run "$job"

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
