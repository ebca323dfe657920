#!/usr/bin/env bash
# Admission latency: submit -> every process of an N-member gang running,
# `nomad job run` vs `gpujob submit` vs `gpujob submit` in queue mode,
# interleaved, on a dev cluster of its own (see queue_latency.py).
#   scripts/bench/queue-latency.sh [--runs 5] [--n 2] [--help]
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/queue_latency.py" "$@"
