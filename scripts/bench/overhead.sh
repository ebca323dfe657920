#!/usr/bin/env bash
# The driver's overhead on training throughput: 2-worker training by hand vs
# under the gpujob driver, alternating, on a dev cluster of its own (see
# overhead.py for the method).
#   scripts/bench/overhead.sh [--runs 15] [--steps 300] [--help]
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/overhead.py" "$@"
