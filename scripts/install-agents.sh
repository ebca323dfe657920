#!/usr/bin/env bash
# Builds the real Nomad and Consul agents at the pinned versions from the Go
# module proxy, into a cache outside the checkout, and does nothing when the
# right version is already there. Usage: scripts/install-agents.sh [nomad] [consul]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

# build NAME VERSION BIN MODULE_DIR PACKAGE
build() {
	local name=$1 version=$2 bin=$3 moddir=$4 pkg=$5
	# Read the whole output before matching: `version | head -1` under
	# pipefail fails at random when head closes the pipe early (SIGPIPE).
	local have=""
	[ -x "$bin" ] && have=$("$bin" version 2>/dev/null || true)
	if [[ $have == *"v${version}"* ]]; then
		log "$name v$version: cached at $bin"
		return 0
	fi
	log "$name v$version: building from the module proxy into $bin (3-4 minutes on 2 cores, once)"
	mkdir -p "$(dirname "$bin")"
	local start=$SECONDS
	# Build into a temporary name and rename, so an interrupted build never
	# leaves a half-written binary that looks cached.
	(cd "$moddir" && CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}" \
		go build -trimpath -o "$bin.tmp.$$" "$pkg")
	mv "$bin.tmp.$$" "$bin"
	log "$name v$version: built in $((SECONDS - start))s"
	have=$("$bin" version)
	echo "${have%%$'\n'*}" >&2
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(nomad consul)
for w in "${want[@]}"; do
	case $w in
	nomad) build Nomad "$NOMAD_VERSION" "$(gpujob_nomad_bin)" "$here/tools/nomad" github.com/hashicorp/nomad ;;
	consul) build Consul "$CONSUL_VERSION" "$(gpujob_consul_bin)" "$here/tools/consul" github.com/hashicorp/consul ;;
	*) die "unknown agent '$w' (want nomad or consul)" ;;
	esac
done
