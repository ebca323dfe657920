#!/usr/bin/env bash
# Side by side, in one run, interleaved: gpujob's Consul rendezvous and torch's
# c10d dynamic rendezvous as shipped and with its 1 s poll patched to 50 ms,
# M separate member processes each (see rdzv_compare.py for the method).
#   scripts/bench/rdzv-compare.sh [--runs 5] [--m 8,32,64] [--help]
here=$(cd "$(dirname "$0")" && pwd)
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
exec /usr/bin/python3 "$here/rdzv_compare.py" "$@"
