#!/usr/bin/env bash
# Trace replay: one seeded trace of gang jobs of two teams, replayed on a dev
# cluster of its own three ways, interleaved: gpujob's queue vs plain Nomad vs
# Nomad with batch preemption on (see queue_replay.py).
#   scripts/bench/queue-replay.sh [--runs 5] [--jobs 40] [--seed 1] [--time-scale 1] [--help]
# The cluster: GPUJOB_DEV_CLIENTS clients (3) of GPUJOB_FAKE_GPUS fake GPUs
# (4), no gateway and no exporter (GPUJOB_DEV_GATEWAY / GPUJOB_DEV_EXPORTER).
here=$(cd "$(dirname "$0")" && pwd)
export GPUJOB_DEV_CLIENTS=${GPUJOB_DEV_CLIENTS:-3}
export GPUJOB_DEV_BACKEND=${GPUJOB_DEV_BACKEND:-fake}
export GPUJOB_FAKE_GPUS=${GPUJOB_FAKE_GPUS:-4}
export GPUJOB_DEV_GATEWAY=${GPUJOB_DEV_GATEWAY:-0}
export GPUJOB_DEV_EXPORTER=${GPUJOB_DEV_EXPORTER:-0}
# No cluster for what needs none.
case " $* " in
*" --help "* | *" -h "* | *" --print-trace "*) exec /usr/bin/python3 "$here/queue_replay.py" "$@" ;;
esac
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/queue_replay.py" "$@"
