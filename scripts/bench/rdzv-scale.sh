#!/usr/bin/env bash
# Rendezvous scale, in one run, interleaved: an in-memory Consul dev agent vs
# the dev cluster's 3-server Consul with data on disk (see rdzv_scale.py).
#   scripts/bench/rdzv-scale.sh [--runs 5] [--help]
here=$(cd "$(dirname "$0")" && pwd)
export CGO_CFLAGS=${CGO_CFLAGS:-"-O2 -g -Wno-deprecated-declarations"}
case " $* " in
*" --help "* | *" -h "*) exec /usr/bin/python3 "$here/rdzv_scale.py" --help ;;
esac
GPUJOB_DEV_CONSUL_SERVERS=3 exec "$here/with-dev-cluster.sh" /usr/bin/python3 "$here/rdzv_scale.py" "$@"
