#!/usr/bin/env bash
# `make demo`: the main job on a local dev cluster. Starts the cluster (fake
# GPUs when the machine has no NVIDIA driver), submits the BERT-style
# fine-tune of jobspecs/examples/bert-finetune.hcl with 2 workers through
# `gpujob submit`, streams its progress and the workers' output, and ends
# with the result and where to look further. The cluster stays up;
# `make dev-down` stops it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"

dir=$(gpujob_dev_dir)
# (a cluster with TLS asks for the CA and a client certificate: the curl
# arguments come from its env file)
if [ -f "$dir/env" ] && mapfile -t tls_curl < <(gpujob_dev_curl_args "$dir" nomad tls) &&
	curl -fsS "${tls_curl[@]}" "$(gpujob_dev_env_value "$dir" NOMAD_ADDR)/v1/status/leader" >/dev/null 2>&1; then
	log "reusing the dev cluster in $dir"
else
	"$here/dev-up.sh"
fi
# shellcheck disable=SC1091
. "$dir/env"
gpujob=$repo/bin/gpujob

log "the cluster's GPUs (gpujob gpus):"
"$gpujob" gpus

status=0
if [ "${GPUJOB_DEV_DOCKER:-0}" = 1 ]; then
	# make demo DOCKER=1: the same fine-tune with every member in the
	# image built from this machine's python3-torch (no registry).
	job=bert-image
	spec=$repo/jobspecs/examples/bert-image.hcl
	image=$("$here/build-train-image.sh" | tail -n 1)
	log "submitting $spec in $image with 2 workers (gpujob submit --logs)"
	"$gpujob" submit --logs -var workers=2 -var "image=$image" \
		-var 'args=["--log-every", "80"]' "$spec" || status=$?
else
	job=bert-finetune
	spec=$repo/jobspecs/examples/bert-finetune.hcl
	log "submitting $spec with 2 workers (gpujob submit --logs)"
	# The cluster's copy of the workloads: the ranks run as nobody, who may
	# not be able to read the checkout.
	workloads=${GPUJOB_DEV_WORKLOADS:-$repo/jobspecs/workloads}
	"$gpujob" submit --logs -var workers=2 -var "workload=$workloads/bert_finetune.py" \
		-var 'args=["--log-every", "80"]' "$spec" || status=$?
fi

log "the job's members (gpujob status $job):"
"$gpujob" status "$job" || true

consul_ui=$CONSUL_HTTP_ADDR
[[ $consul_ui == *://* ]] || consul_ui=http://$consul_ui
cat <<MSG

Look further:
  source $dir/env                      # NOMAD_ADDR, CONSUL_HTTP_ADDR, nomad and consul on PATH (and TLS files, NOMAD_TOKEN)
  $gpujob status $job         # members, ranks, GPUs, latest loss (-json for scripts)
  $gpujob logs $job --rank 1  # one rank's output (-f to follow)
  $gpujob gpus                         # every GPU, its health, stats and holder
  Nomad UI: $NOMAD_ADDR/ui/jobs/$job     Consul UI: $consul_ui/ui
Stop the cluster: make dev-down
MSG
exit "$status"
