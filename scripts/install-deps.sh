#!/usr/bin/env bash
# Installs the Debian packages gpujob's scripts and tests use. Idempotent:
# packages already present are not fetched again.
#
# docker.io (dockerd, containerd, runc, tini as docker-init) is for the dev
# cluster's own dockerd (GPUJOB_DEV_DOCKER=1, make dev DOCKER=1), which
# scripts/dev-up.sh starts with its own data-root, exec-root and socket. The
# system's docker service is neither started nor left enabled: installing
# runs under a policy-rc.d that forbids starting services (where there is no
# systemd, docker.io's postinst would otherwise run /etc/init.d/docker, a
# system dockerd with a bridge and iptables rules), and on a systemd machine
# the units docker.io installs are disabled afterwards.
#
# prometheus (Debian's 2.42: prometheus and promtool) is for the alert rules'
# tests (go test ./jobspecs/monitoring/) and the dev cluster's Prometheus
# (jobspecs/monitoring/prometheus.yml). The prometheus system service is
# likewise neither started nor left enabled.
#
# Every package a test needs is here: with GPUJOB_REQUIRE_PRIV=1 (.ci/run)
# a test that misses one fails instead of skipping (internal/testpriv):
# python3 (/usr/bin/python3: the zygote and search-quality tests),
# python3-torch (the workloads), python3-optuna (the pruner and sampler
# cross-checks), prometheus (promtool), tmux (gpujob top's terminal test).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

packages=(curl ca-certificates jq iproute2 util-linux procps python3 python3-torch libopenblas0-openmp python3-optuna docker.io prometheus tmux)
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

# No service starts while the packages install (exit 101: "action
# forbidden", which invoke-rc.d and deb-systemd-invoke honour, and the
# maintainer scripts take as success). A policy-rc.d already there is put
# back afterwards.
policy=/usr/sbin/policy-rc.d
saved=$policy.gpujob-saved
restore_policy() {
	if [ -e "$saved" ] || [ -L "$saved" ]; then
		mv -f "$saved" "$policy"
	else
		rm -f "$policy"
	fi
}
if [ -e "$policy" ] || [ -L "$policy" ]; then
	mv -f "$policy" "$saved"
fi
trap restore_policy EXIT
printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while it installs packages\nexit 101\n' >"$policy"
chmod 0755 "$policy"

apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"

restore_policy
trap - EXIT

# docker.io enables its units for the next boot; nothing here uses them.
if [[ " ${missing[*]} " == *" docker.io "* ]]; then
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
		systemctl disable --now docker.socket docker.service >/dev/null 2>&1 || true
		log "disabled the system's docker.service and docker.socket (the dev cluster starts its own dockerd)"
	elif command -v update-rc.d >/dev/null && [ -x /etc/init.d/docker ]; then
		update-rc.d docker disable >/dev/null 2>&1 || true
	fi
fi
# prometheus likewise: the dev cluster and the tests start their own.
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
		systemctl disable --now prometheus.service >/dev/null 2>&1 || true
		log "disabled the system's prometheus.service (the dev cluster and tests start their own)"
	elif command -v update-rc.d >/dev/null && [ -x /etc/init.d/prometheus ]; then
		update-rc.d prometheus disable >/dev/null 2>&1 || true
	fi
fi
