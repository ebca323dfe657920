#!/usr/bin/env bash
# Gang start: `nomad job run` -> every process of N members running, gpujob
# vs raw_exec, interleaved, on a dev cluster of its own (see gang_start.py).
#   scripts/bench/gang-start.sh [--runs 5] [--n 2,8,16] [--help]
#   scripts/bench/gang-start.sh --runs 5 --n 2,8 --drivers gpujob-docker,gpujob --task python
# (gpujob-docker: container members; the cluster then gets its dockerd.)
here=$(cd "$(dirname "$0")" && pwd)
case " $* " in *gpujob-docker*) export GPUJOB_DEV_DOCKER=1 ;; esac
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/gang_start.py" "$@"
