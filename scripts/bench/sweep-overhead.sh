#!/usr/bin/env bash
# Trial overhead: N one-GPU trials of `sleep 1`, P at a time, as a gpujob sweep
# vs the same jobs dispatched by hand in a shell loop (dispatch-loop.sh),
# interleaved, on a dev cluster of its own (see sweep_overhead.py for the
# method and the exact definitions of the figures).
#   scripts/bench/sweep-overhead.sh [--runs 5] [--trials 40] [--parallel 4] [--help]
# --dev-env FILE runs on the dev cluster already running whose env file FILE is
# (e.g. /tmp/gpujob-dev/env, from make dev) instead of starting one: its GPUs
# must be free, and its other work skews the figures.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dev_env=
prev=
for arg in "$@"; do
	case $prev in --dev-env) dev_env=$arg ;; esac
	case $arg in --dev-env=*) dev_env=${arg#--dev-env=} ;; esac
	prev=$arg
done
case " $* " in
*" --help "* | *" -h "*) exec /usr/bin/python3 "$here/sweep_overhead.py" --help ;;
esac
if [ -n "$dev_env" ]; then
	# shellcheck disable=SC1090
	. "$dev_env"
	export NOMAD_BIN=${GPUJOB_DEV_NOMAD_BIN:-nomad}
	exec /usr/bin/python3 "$here/sweep_overhead.py" "$@"
fi
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/sweep_overhead.py" "$@"
