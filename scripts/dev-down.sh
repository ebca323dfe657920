#!/usr/bin/env bash
# Stops the local dev cluster that scripts/dev-up.sh started from
# GPUJOB_DEV_DIR (/tmp/gpujob-dev): its agents, and the task, executor and
# plugin processes its Nomad clients left behind; with GPUJOB_DEV_DOCKER=1 its
# dockerd and every container of it (the data-root and its images stay); then
# unmounts what the tasks mounted and removes the state dir. Safe to run when
# nothing is up.
#
# Usage: scripts/dev-down.sh [--keep-logs]
#   --keep-logs  leave $GPUJOB_DEV_DIR/logs (dev-up uses it after a failed start)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

keep_logs=0
case ${1:-} in
"") ;;
--keep-logs) keep_logs=1 ;;
*) die "usage: $0 [--keep-logs]" ;;
esac

dir=$(gpujob_dev_dir)
if [ ! -e "$dir" ]; then
	echo "no dev cluster to stop: $dir does not exist"
	exit 0
fi
# dev-up marks its state dir; never kill or rm -rf on the strength of an
# environment variable that points somewhere else.
[ -f "$dir/.gpujob-dev" ] || die "$dir is not a gpujob dev state dir (no .gpujob-dev marker); not touching it"
dir=$(cd "$dir" && pwd -P)

# stop GRACE PID... sends SIGTERM, waits up to GRACE seconds, then SIGKILLs
# whatever is left.
stop() {
	local grace=$1 end p left
	shift
	[ $# -gt 0 ] || return 0
	kill -TERM "$@" 2>/dev/null || true
	end=$((SECONDS + grace))
	while :; do
		left=()
		for p; do gpujob_proc_alive "$p" && left+=("$p"); done
		[ ${#left[@]} -gt 0 ] || return 0
		((SECONDS < end)) || break
		sleep 0.2
	done
	log "still running after ${grace}s, killing: ${left[*]}"
	kill -KILL "${left[@]}" 2>/dev/null || true
	for ((end = 0; end < 25; end++)); do
		left=()
		for p in "$@"; do gpujob_proc_alive "$p" && left+=("$p"); done
		[ ${#left[@]} -gt 0 ] || return 0
		sleep 0.2
	done
	log "warning: still alive after SIGKILL: ${left[*]}"
}

# descendants PID... prints every descendant of the given processes.
descendants() {
	# shellcheck disable=SC2009 # ps is the portable way to get every ppid at once
	ps -e -o pid=,ppid= | awk -v roots="$*" '
		{ kids[$2] = kids[$2] " " $1 }
		END {
			n = split(roots, q, " ")
			for (i = 1; i <= n; i++) {
				m = split(kids[q[i]], k, " ")
				for (j = 1; j <= m; j++)
					if (!(k[j] in seen)) { seen[k[j]] = 1; q[++n] = k[j]; print k[j] }
			}
		}'
}

# ancestors prints this script's PID and those of its ancestors, which must
# survive however they mention the state dir (a shell whose cwd is in it, a
# test harness that names it on its command line).
ancestors() {
	local p=$$ stat
	while [ "$p" -gt 1 ] 2>/dev/null; do
		echo "$p"
		stat=$(cat "/proc/$p/stat" 2>/dev/null) || break
		stat=${stat##*) }
		p=$(echo "$stat" | cut -d' ' -f2)
	done
}

# leftovers prints processes that work in a client's data dir or the plugin
# dir (cwd, an open file, or their command line names it): task processes,
# executors, logmon, plugins, and agents whose PID file is gone. After a
# client crash these are no longer its descendants, so they are found this
# way. dev-up starts each client in its data dir, so even helpers that name
# no path (logmon) have their cwd there.
leftovers() {
	{
		find /proc/[0-9]*/cwd /proc/[0-9]*/fd/ -maxdepth 1 \
			\( -lname "$dir/client-*" -o -lname "$dir/plugins/*" \) 2>/dev/null | cut -d/ -f3
		# -a: command lines are NUL-separated, which grep would call binary.
		grep -laF -e "$dir/client-" -e "$dir/plugins/" -e "$dir/config/" /proc/[0-9]*/cmdline 2>/dev/null |
			cut -d/ -f3
	} | sort -un
}

stopped=0
pids_of() { # NAME-GLOB: live PIDs from matching PID files
	local f pid
	for f in "$dir"/pids/$1.pid; do
		[ -e "$f" ] || continue
		pid=$(gpujob_dev_pid "$f" "$dir") && echo "$pid"
	done
	return 0
}

# 1. The clients first: a live client would restart the tasks killed below.
#    Their process trees are taken before they exit, while the tasks and
#    plugins are still their descendants.
mapfile -t client_pids < <(pids_of 'nomad-client-*')
tree=()
if [ ${#client_pids[@]} -gt 0 ]; then
	mapfile -t tree < <(descendants "${client_pids[@]}")
	log "stopping ${#client_pids[@]} Nomad client(s)"
	stop 10 "${client_pids[@]}"
	stopped=1
fi

# 1b. The cluster's own dockerd (GPUJOB_DEV_DOCKER=1), once the clients are
#     gone: a Nomad client leaves its containers running when it stops, as
#     it does every task. Every container of that dockerd is this cluster's:
#     docker rm -f them all, then stop dockerd (it stops its containerd).
#     Only a dockerd whose command line names this state dir is touched.
docker_dir=$dir/docker
if [ -d "$docker_dir" ]; then
	docker_cli=$(gpujob_docker_cli)
	docker_sock=$docker_dir/docker.sock
	dockerd_pid=$(gpujob_dev_pid "$dir/pids/dockerd.pid" "$dir" || gpujob_dev_pid "$docker_dir/dockerd.pid" "$dir" || true)
	if [ -n "$dockerd_pid" ]; then
		containers=()
		if [ -S "$docker_sock" ] && [ -x "$docker_cli" ]; then
			mapfile -t containers < <(timeout 20 "$docker_cli" -H "unix://$docker_sock" ps -aq 2>/dev/null || true)
		fi
		if [ ${#containers[@]} -gt 0 ]; then
			log "removing ${#containers[@]} container(s) of the cluster's dockerd"
			timeout 60 "$docker_cli" -H "unix://$docker_sock" rm -f "${containers[@]}" >/dev/null 2>&1 ||
				log "warning: docker rm -f failed; what is left is killed below"
		fi
		log "stopping dockerd (pid $dockerd_pid)"
		stop 15 "$dockerd_pid"
		stopped=1
	fi
	# What a dockerd that died or had to be killed left: its containerd,
	# the containers' shims and, below them, the containers' processes;
	# each names the exec-root on its command line.
	mapfile -t keep < <(ancestors)
	mapfile -t shims < <(grep -laF "$docker_dir/exec" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3)
	rest=()
	if [ ${#shims[@]} -gt 0 ]; then
		mapfile -t below < <(descendants "${shims[@]}")
		for p in "${shims[@]}" "${below[@]}"; do
			[[ " ${keep[*]} ${rest[*]} " == *" $p "* ]] && continue
			gpujob_proc_alive "$p" && rest+=("$p")
		done
	fi
	if [ ${#rest[@]} -gt 0 ]; then
		log "stopping ${#rest[@]} process(es) left by the cluster's dockerd (containerd, shims, containers)"
		stop 5 "${rest[@]}"
		stopped=1
	fi
	# A dockerd that is killed leaves the data-root mounted on itself and,
	# with containers running, their root filesystems and shm mounted in
	# it; with no dockerd on it any more, they are stale.
	docker_root=$(cat "$docker_dir/data-root" 2>/dev/null || true)
	if [ -n "$docker_root" ] && [ -z "$(gpujob_dockerd_on "$docker_root")" ]; then
		mapfile -t mounts < <(
			awk -v d="$docker_root" '{ p = $5; gsub(/\\040/, " ", p); if (p == d || index(p, d "/") == 1) print p }' /proc/self/mountinfo |
				awk '{ print gsub("/", "/") "\t" $0 }' | sort -rn | cut -f2-
		)
		[ ${#mounts[@]} -eq 0 ] || log "unmounting ${#mounts[@]} mount(s) a killed dockerd left in $docker_root"
		for m in "${mounts[@]}"; do
			umount "$m" 2>/dev/null || umount -l "$m" || log "warning: could not unmount $m"
		done
	fi
fi

# 2. What the clients left running: Nomad deliberately leaves executors and
#    tasks alive when a client stops (so they survive an agent restart). The
#    server and Consul go last (step 3), and this script's callers never.
mapfile -t others < <(pids_of 'nomad-server*'; pids_of 'consul*')
mapfile -t found < <(leftovers)
mapfile -t keep < <(ancestors; printf '%s\n' "${others[@]}")
rest=()
for p in "${tree[@]}" "${found[@]}"; do
	[[ " ${keep[*]} ${rest[*]} " == *" $p "* ]] && continue
	gpujob_proc_alive "$p" && rest+=("$p")
done
if [ ${#rest[@]} -gt 0 ]; then
	log "stopping ${#rest[@]} task/executor/plugin process(es) left by the clients"
	stop 10 "${rest[@]}"
	stopped=1
fi

# 3. The Nomad server(s) and the Consul agents.
if [ ${#others[@]} -gt 0 ]; then
	log "stopping the Nomad server and the Consul agent(s)"
	stop 10 "${others[@]}"
	stopped=1
fi
[ "$stopped" = 1 ] || log "no dev cluster processes were running from $dir"

# 4. Nomad mounts a tmpfs on each task's secrets/ and private/ (and may bind
#    mount more); rm -rf fails with "Device or resource busy" on those.
#    Deepest first, since mounts can nest.
mapfile -t mounts < <(
	awk -v d="$dir" '{ p = $5; gsub(/\\040/, " ", p); if (index(p, d "/") == 1) print p }' /proc/self/mountinfo |
		awk '{ print gsub("/", "/") "\t" $0 }' | sort -rn | cut -f2-
)
if [ ${#mounts[@]} -gt 0 ]; then
	log "unmounting ${#mounts[@]} mount(s) under $dir"
	for m in "${mounts[@]}"; do
		# Lazy unmount as a last resort: it detaches the mount now and
		# frees it once nothing uses it.
		umount "$m" 2>/dev/null || umount -l "$m" || log "warning: could not unmount $m"
	done
fi

# 4b. What the gpujob driver keeps outside the state dir for the clients'
#    container members (/run/gpujob/<alloc ID>: a spec with the Consul
#    token, the static supervisor): the driver removes it when Nomad
#    destroys the sidecar, which a client stopped here never does. Only
#    the allocations of this cluster's clients.
for a in "$dir"/client-*/data/alloc/*/; do
	id=$(basename "$a")
	[[ $id =~ ^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$ ]] || continue
	if [ -e "/run/gpujob/$id" ]; then rm -rf "/run/gpujob/$id"; fi
done

# 5. The clients' cgroups (dev-up gives each client its own cgroup parent,
#    and its dockerd's containers one):
#    empty cgroups can only be removed with rmdir, deepest first.
if [ -f "$dir/cgroup-parents" ]; then
	while read -r cg; do
		[ -n "$cg" ] || continue
		for c in /sys/fs/cgroup/"${cg#/}" /sys/fs/cgroup/*/"${cg#/}"; do
			[ -d "$c" ] || continue
			find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
		done
	done <"$dir/cgroup-parents"
fi

# 6. The state dir.
if [ "$keep_logs" = 1 ]; then
	find "$dir" -mindepth 1 -maxdepth 1 ! -name logs ! -name .gpujob-dev -exec rm -rf {} +
	echo "stopped the dev cluster; logs kept in $dir/logs"
else
	rm -rf "$dir"
	echo "stopped the dev cluster and removed $dir"
fi
