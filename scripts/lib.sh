# shellcheck shell=bash
# Shared helpers for gpujob's scripts. Source it; it defines functions only.

# gpujob_cache_dir prints the directory that holds the agent builds. It sits
# outside the checkout so a fresh clone (CI) reuses what an earlier run built.
gpujob_cache_dir() {
	echo "${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob}"
}

NOMAD_VERSION=1.6.3
CONSUL_VERSION=1.15.6

# gpujob_nomad_bin / gpujob_consul_bin print the agent binaries to use:
# NOMAD_BIN / CONSUL_BIN when set, else the cached build of the pinned version.
gpujob_nomad_bin() {
	echo "${NOMAD_BIN:-$(gpujob_cache_dir)/nomad-${NOMAD_VERSION}/nomad}"
}
gpujob_consul_bin() {
	echo "${CONSUL_BIN:-$(gpujob_cache_dir)/consul-${CONSUL_VERSION}/consul}"
}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- local dev cluster (scripts/dev-up.sh, dev-down.sh, dev-client.sh) ---

# gpujob_dev_dir prints the dev cluster's state directory.
gpujob_dev_dir() {
	echo "${GPUJOB_DEV_DIR:-/tmp/gpujob-dev}"
}

# gpujob_dev_pid PIDFILE DIR prints the PID in PIDFILE if that process is
# alive and its command line names DIR (every agent the dev cluster starts is
# given a config file under DIR), so a PID the kernel has since reused for an
# unrelated process is never mistaken for ours.
gpujob_dev_pid() {
	local pidfile=$1 dir=$2 pid
	[ -r "$pidfile" ] || return 1
	pid=$(<"$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	gpujob_proc_alive "$pid" || return 1
	# grep without -q reads all its input: with -q, tr could die of SIGPIPE
	# and pipefail would turn a match into a failure.
	tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -F "$dir/" >/dev/null || return 1
	echo "$pid"
}

# gpujob_proc_alive PID succeeds while PID exists and is not a zombie (where
# PID 1 doesn't reap, as in some containers, a killed process can stay a
# zombie forever, and kill -0 would still succeed on it).
gpujob_proc_alive() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	# The state follows the command name, which is in parentheses and may
	# itself contain spaces or parentheses.
	stat=${stat##*) }
	[ "${stat%% *}" != Z ]
}

# gpujob_dev_start DIR NOMAD_ADDR CONSUL_ADDR NAME WD CMD... runs CMD in WD in
# its own session (it outlives the calling script and the terminal), with
# NOMAD_ADDR, CONSUL_HTTP_ADDR and TMPDIR set, output appended to
# DIR/logs/NAME.log, PID in DIR/pids/NAME.pid; it returns once the PID file is
# written. dev-up starts every agent with it, dev-client restarts clients
# with it, so a restarted client runs exactly as dev-up ran it.
# The inner bash records its own PID and then execs CMD, so the PID file
# names the agent itself whether or not setsid had to fork. Working in the
# state dir keeps the checkout free to go, and lets dev-down find a client's
# helpers (logmon names no path) by their inherited cwd. TMPDIR in the state
# dir: go-plugin puts its sockets there, and those of killed executors and
# logmons would otherwise pile up in /tmp. Appending, not truncating: dev-up
# always starts from an empty logs/, and a restarted client keeps the log of
# the run before.
gpujob_dev_start() {
	local dir=$1 nomad_addr=$2 consul_addr=$3 name=$4 wd=$5 n
	shift 5
	# A PID file left by an agent that died would otherwise pass the wait
	# below at once.
	rm -f "$dir/pids/$name.pid"
	(
		cd "$wd" || exit 1
		# shellcheck disable=SC2016 # $$ and $@ are for the inner shell
		exec setsid bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$dir/pids/$name.pid" \
			env NOMAD_ADDR="$nomad_addr" CONSUL_HTTP_ADDR="$consul_addr" TMPDIR="$dir/tmp" "$@" \
			>>"$dir/logs/$name.log" 2>&1 </dev/null
	) &
	for ((n = 0; n < 50; n++)); do
		[ -s "$dir/pids/$name.pid" ] && return 0
		sleep 0.1
	done
	die "$name did not start"
}

# gpujob_consul_server_ip N SERVERS prints Consul server N's address: the one
# server of a single-server cluster binds 127.0.0.1 and serves the API there;
# each of several binds 127.0.1.N, clear of the Nomad clients' 127.0.0.(i+1)
# and of the client agent that then takes 127.0.0.1.
gpujob_consul_server_ip() {
	if (($2 == 1)); then
		echo 127.0.0.1
	else
		echo "127.0.1.$1"
	fi
}

# gpujob_has_leader URL succeeds once URL's /v1/status/leader (Consul's or
# Nomad's) names a leader.
gpujob_has_leader() {
	local body
	body=$(curl -fsS --max-time 2 "$1/v1/status/leader" 2>/dev/null) || return 1
	[ -n "$body" ] && [ "$body" != '""' ]
}

# gpujob_consul_node_healthy ADDR NODE succeeds once the catalog, asked at
# ADDR (host:port), has NODE with a passing serfHealth check: only then can a
# session be created on that node.
gpujob_consul_node_healthy() {
	curl -fsS --max-time 2 "http://$1/v1/health/node/$2" 2>/dev/null |
		grep -E '"CheckID": ?"serfHealth"[^}]*"Status": ?"passing"' >/dev/null
}
