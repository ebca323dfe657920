#!/usr/bin/env bash
# Installs the Debian packages gpujob's scripts and tests use. Idempotent:
# packages already present are not fetched again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

packages=(curl ca-certificates jq iproute2 util-linux procps python3-torch libopenblas0-openmp)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	log "Debian packages: all present (${packages[*]})"
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die "need root to install: ${missing[*]} (or install them yourself)"
log "Debian packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
