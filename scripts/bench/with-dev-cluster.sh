#!/usr/bin/env bash
# with-dev-cluster.sh CMD [ARG...] runs CMD with a dev cluster of its own
# (scripts/dev-up.sh: Consul, a Nomad server, one client with the gpujob
# plugins and raw_exec) and stops the cluster when CMD ends, fails or is
# interrupted. CMD sees NOMAD_ADDR, CONSUL_HTTP_ADDR and NOMAD_BIN.
#
# Its own state dir and ports, so it runs beside a developer's cluster:
#   GPUJOB_BENCH_DEV_DIR      (/tmp/gpujob-bench)
#   GPUJOB_BENCH_PORT_OFFSET  (20000; see GPUJOB_DEV_PORT_OFFSET in dev-up.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=scripts/lib.sh
. "$repo/scripts/lib.sh"

[ $# -ge 1 ] || die "usage: $0 CMD [ARG...]"
[ -x "$repo/bin/nomad-driver-gpujob" ] || die "no $repo/bin/nomad-driver-gpujob: run make build first"
export GPUJOB_DEV_DIR=${GPUJOB_BENCH_DEV_DIR:-/tmp/gpujob-bench}
export GPUJOB_DEV_PORT_OFFSET=${GPUJOB_BENCH_PORT_OFFSET:-20000}

child=
stop() {
	# CMD runs in the background (so a signal reaches this trap at once):
	# ask it to clean up, give it time, then stop the cluster.
	if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
		kill -TERM "$child" 2>/dev/null || true
		for _ in $(seq 1 300); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$child" 2>/dev/null || true
	fi
	"$repo/scripts/dev-down.sh" >/dev/null 2>&1 || log "dev-down failed; see $GPUJOB_DEV_DIR"
}
trap stop EXIT
trap 'exit 130' INT TERM HUP

"$repo/scripts/dev-up.sh" >&2
# shellcheck disable=SC1091
. "$GPUJOB_DEV_DIR/env"
NOMAD_BIN=$(gpujob_nomad_bin)
export NOMAD_BIN

"$@" &
child=$!
rc=0
wait "$child" || rc=$?
child=
exit "$rc"
