#!/usr/bin/env bash
# Failure -> all ranks stepping again: gpujob vs torchrun vs a fresh launch,
# interleaved, on a dev cluster of its own (see recovery.py for the method).
#   scripts/bench/recovery.sh [--runs 5] [--columns gpujob,torchrun,floor] [--help]
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/recovery.py" "$@"
