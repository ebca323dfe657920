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

# --- local dev cluster (scripts/dev-up.sh, dev-down.sh, dev-client.sh, ...) ---

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
# NOMAD_ADDR (without TLS), CONSUL_HTTP_ADDR and TMPDIR set, output appended to
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
	local dir=$1 nomad_addr=$2 consul_addr=$3 name=$4 wd=$5 n nomad_env
	shift 5
	# A Nomad client's consul-template reads NOMAD_ADDR for the templates'
	# Nomad API, which it reaches through an in-memory plain-HTTP listener:
	# an https:// address there fails every nomadVar template ("server gave
	# HTTP response to HTTPS client"). So with TLS no agent gets one.
	nomad_env=(NOMAD_ADDR="$nomad_addr")
	[[ $nomad_addr != https://* ]] || nomad_env=(-u NOMAD_ADDR)
	# A PID file left by an agent that died would otherwise pass the wait
	# below at once.
	rm -f "$dir/pids/$name.pid"
	(
		cd "$wd" || exit 1
		# shellcheck disable=SC2016 # $$ and $@ are for the inner shell
		exec setsid bash -c 'echo $$ >"$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$dir/pids/$name.pid" \
			env "${nomad_env[@]}" CONSUL_HTTP_ADDR="$consul_addr" TMPDIR="$dir/tmp" "$@" \
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

# gpujob_has_leader URL [CURL_ARG...] succeeds once URL's /v1/status/leader
# (Consul's or Nomad's) names a leader. CURL_ARGs are what TLS needs (--cacert,
# --cert, --key); the endpoint needs no ACL token.
gpujob_has_leader() {
	local url=$1 body
	shift
	body=$(curl -fsS --max-time 2 "$@" "$url/v1/status/leader" 2>/dev/null) || return 1
	[ -n "$body" ] && [ "$body" != '""' ]
}

# gpujob_consul_node_healthy ADDR NODE [CURL_ARG...] succeeds once the
# catalog, asked at ADDR (host:port, or a URL), has NODE with a passing
# serfHealth check: only then can a session be created on that node.
# CURL_ARGs add TLS and, with ACLs, a token header (node read).
gpujob_consul_node_healthy() {
	local addr=$1 node=$2
	shift 2
	[[ $addr == *://* ]] || addr=http://$addr
	curl -fsS --max-time 2 "$@" "$addr/v1/health/node/$node" 2>/dev/null |
		grep -E '"CheckID": ?"serfHealth"[^}]*"Status": ?"passing"' >/dev/null
}

# --- acting on one agent of a running dev cluster (dev-consul.sh, ---
# --- dev-nomad.sh, dev-client.sh)                                 ---

# gpujob_dev_timeout prints GPUJOB_DEV_TIMEOUT (default 60): the seconds a
# start waits for the cluster to work again.
gpujob_dev_timeout() {
	local timeout=${GPUJOB_DEV_TIMEOUT:-60}
	[[ $timeout =~ ^[0-9]+$ ]] || die "GPUJOB_DEV_TIMEOUT must be a whole number, got '$timeout'"
	echo "$timeout"
}

# gpujob_dev_up_dir prints the real path of the dev cluster's state dir, and
# fails unless dev-up.sh started a cluster there and finished. dev-up records
# real paths (in PID files' processes, configs, TMPDIR); so must an agent
# started again, or dev-down would not recognise it. dev-up writes env only
# once the whole cluster was ready, so its absence means a start that failed
# or is still under way.
gpujob_dev_up_dir() {
	local dir here
	dir=$(gpujob_dev_dir)
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	[ -f "$dir/.gpujob-dev" ] || die "no dev cluster in $dir (start one with $here/dev-up.sh, or set GPUJOB_DEV_DIR)"
	dir=$(cd "$dir" && pwd -P)
	[ -f "$dir/env" ] || die "the dev cluster in $dir is not up (no $dir/env): run $here/dev-up.sh"
	echo "$dir"
}

# gpujob_dev_env_value DIR NAME prints NAME's value from the env file dev-up
# wrote in DIR (lines export NAME='value'); read, not sourced, so nothing in
# it runs here.
gpujob_dev_env_value() {
	sed -n "s/^export $2='\\(.*\\)'\$/\\1/p" "$1/env" | head -n 1
}

# gpujob_dev_curl_args DIR nomad|consul [tls] prints, one per line, the curl
# arguments for an API of the dev cluster in DIR: with TLS
# (GPUJOB_DEV_TLS=1) the API's CA and -cli certificate; with ACLs
# (GPUJOB_DEV_ACL=1), unless "tls" alone is asked for, the management
# token's header file (-H @FILE: the secret stays off the command line).
# Read it with: mapfile -t args < <(gpujob_dev_curl_args "$dir" nomad)
gpujob_dev_curl_args() {
	local dir=$1 api=$2 only=${3:-}
	if [ "$(gpujob_dev_env_value "$dir" GPUJOB_DEV_TLS)" = 1 ]; then
		printf '%s\n' --cacert "$dir/tls/$api-ca.pem" --cert "$dir/tls/$api-cli.pem" --key "$dir/tls/$api-cli-key.pem"
	fi
	if [ "$only" != tls ] && [ "$(gpujob_dev_env_value "$dir" GPUJOB_DEV_ACL)" = 1 ]; then
		printf '%s\n' -H "@$dir/secrets/$api-management.header"
	fi
}

# gpujob_dev_scheme DIR prints https for a dev cluster started with
# GPUJOB_DEV_TLS=1, else http.
gpujob_dev_scheme() {
	if [ "$(gpujob_dev_env_value "$1" GPUJOB_DEV_TLS)" = 1 ]; then echo https; else echo http; fi
}

# gpujob_python prints the python3 to read the agents' JSON with: Debian's
# first, the one on PATH otherwise.
gpujob_python() {
	command -v /usr/bin/python3 || command -v python3
}

# gpujob_now_ms prints the wall clock in milliseconds; gpujob_elapsed T0
# prints the seconds since T0 (a gpujob_now_ms value) to 0.1 s: an agent's
# restart takes a few seconds, so whole seconds would say little.
gpujob_now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
gpujob_elapsed() {
	local ms=$(($(gpujob_now_ms) - $1))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# gpujob_wait_gone SECONDS PID succeeds once PID has exited (the agent isn't
# our child, so there's no wait(1) for it).
gpujob_wait_gone() {
	local end=$((SECONDS + $1))
	while gpujob_proc_alive "$2"; do
		((SECONDS < end)) || return 1
		sleep 0.1
	done
}

# gpujob_dev_agent_pid DIR NAME [CONFIG] prints the PID of agent NAME: its PID
# file DIR/pids/NAME.pid; failing that, given CONFIG, a process whose command
# line names CONFIG, so an agent whose PID file went missing is neither
# reported stopped nor started twice.
gpujob_dev_agent_pid() {
	local dir=$1 name=$2 config=${3:-} pid
	if pid=$(gpujob_dev_pid "$dir/pids/$name.pid" "$dir"); then
		echo "$pid"
		return 0
	fi
	[ -n "$config" ] || return 1
	# The pattern comes from a file: given as an argument, grep would find
	# its own command line.
	# grep without -q: see gpujob_dev_pid (pipefail + SIGPIPE).
	while read -r pid; do
		[ "$pid" != $$ ] || continue
		gpujob_proc_alive "$pid" || continue
		# An agent, not, say, an editor open on the config.
		tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -x agent >/dev/null || continue
		echo "$pid"
		return 0
	done < <(grep -laFf <(echo "$config") /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3)
	return 1
}

# gpujob_dev_stop DIR NAME CONFIG SIGNAL [NOTE] sends SIGNAL to agent NAME
# (found as gpujob_dev_agent_pid does; CONFIG may be empty) and, if it is
# still up after 15 s, SIGKILL; then removes its PID file, now stale, so
# status says stopped and a start may go. NOTE follows the PID in the log
# line. The signal goes to the agent alone, never its process group or
# children: what an agent leaves running when it exits (a Nomad client's
# tasks) is what dev-down collects.
gpujob_dev_stop() {
	local dir=$1 name=$2 config=$3 signal=$4 note=${5:-} pid t0
	t0=$(gpujob_now_ms)
	if ! pid=$(gpujob_dev_agent_pid "$dir" "$name" "$config"); then
		log "$name is already stopped"
		rm -f "$dir/pids/$name.pid"
		return 0
	fi
	log "stopping $name (pid $pid)$note"
	kill "-$signal" "$pid" 2>/dev/null || true
	if ! gpujob_wait_gone 15 "$pid"; then
		log "$name still running after 15s, killing it"
		kill -KILL "$pid" 2>/dev/null || true
		gpujob_wait_gone 5 "$pid" || die "$name (pid $pid) survived SIGKILL"
	fi
	rm -f "$dir/pids/$name.pid"
	log "$name stopped in $(gpujob_elapsed "$t0")"
}

# gpujob_dev_kill DIR NAME CONFIG [NOTE] SIGKILLs agent NAME, as a crash
# would, and removes its PID file; NOTE follows the PID in the log line.
gpujob_dev_kill() {
	local dir=$1 name=$2 config=$3 note=${4:-} pid
	if ! pid=$(gpujob_dev_agent_pid "$dir" "$name" "$config"); then
		log "$name is already stopped"
		rm -f "$dir/pids/$name.pid"
		return 0
	fi
	log "killing $name (pid $pid)$note"
	kill -KILL "$pid" 2>/dev/null || true
	gpujob_wait_gone 5 "$pid" || die "$name (pid $pid) survived SIGKILL"
	rm -f "$dir/pids/$name.pid"
}

# gpujob_dev_fail_log DIR NAME MESSAGE prints MESSAGE and the tail of agent
# NAME's log, then exits 1.
gpujob_dev_fail_log() {
	local log=$1/logs/$2.log
	printf 'error: %s\n' "$3" >&2
	printf -- '---- last 40 lines of %s ----\n' "$log" >&2
	tail -n 40 "$log" >&2 || true
	printf -- '----\n' >&2
	exit 1
}

# gpujob_dev_restart_agent DIR NOMAD_ADDR CONSUL_ADDR NAME WD CMD... starts
# agent NAME again as dev-up did (gpujob_dev_start: same binary, config, cwd,
# environment, session, PID file and log), after a line in its log that says
# so.
gpujob_dev_restart_agent() {
	printf '\n==> %s: %s started again by %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" "$4" "$(basename "$0")" \
		>>"$1/logs/$4.log"
	log "starting $4"
	gpujob_dev_start "$@"
}

# gpujob_dev_await DIR NAME TIMEOUT INTERVAL HINT CHECK... runs CHECK every
# INTERVAL seconds until it succeeds; while it fails it prints what it still
# waits for. Agent NAME (its PID file written by gpujob_dev_start) exiting
# meanwhile, or TIMEOUT seconds passing, fails with the tail of its log; on a
# timeout the agent is left running, and HINT says how to stop it.
gpujob_dev_await() {
	local dir=$1 name=$2 timeout=$3 interval=$4 hint=$5 pid what deadline
	shift 5
	pid=$(<"$dir/pids/$name.pid")
	deadline=$((SECONDS + timeout))
	while ! what=$("$@"); do
		gpujob_proc_alive "$pid" || gpujob_dev_fail_log "$dir" "$name" "$name exited while starting"
		((SECONDS < deadline)) ||
			gpujob_dev_fail_log "$dir" "$name" "$name (pid $pid) $what after ${timeout}s; it is left running, stop it with: $hint"
		sleep "$interval"
	done
}

# --- Docker for the dev cluster (GPUJOB_DEV_DOCKER=1) ---

# gpujob_docker_cli prints the docker client to use: GPUJOB_DOCKER_CLI, else
# Debian's /usr/bin/docker, which matches the daemon (a different client may
# come first on PATH). Not $DOCKER: `make dev DOCKER=1` puts DOCKER=1 in the
# environment of every script make runs.
gpujob_docker_cli() {
	echo "${GPUJOB_DOCKER_CLI:-/usr/bin/docker}"
}

# gpujob_dockerd_bin prints the daemon: GPUJOB_DOCKERD, else Debian's.
gpujob_dockerd_bin() {
	echo "${GPUJOB_DOCKERD:-/usr/sbin/dockerd}"
}

# gpujob_docker_root prints the data-root of the dev cluster's dockerd:
# GPUJOB_DEV_DOCKER_ROOT, else docker/data in the agent cache, outside the
# checkout and the state dir, so images (the training image) outlive a dev
# cluster and a CI run.
gpujob_docker_root() {
	echo "${GPUJOB_DEV_DOCKER_ROOT:-$(gpujob_cache_dir)/docker/data}"
}

# gpujob_dockerd_on ROOT prints the PID of each live dockerd whose data-root
# (--data-root, or /var/lib/docker when its command line names none) is
# ROOT. Only one daemon may use a data-root at a time: a second one's
# containerd hangs on the first one's lock, and fails after a minute.
gpujob_dockerd_on() {
	local root f pid args i r
	root=$(realpath -m "$1")
	for f in /proc/[0-9]*/cmdline; do
		pid=${f#/proc/}
		pid=${pid%/cmdline}
		mapfile -d '' -t args 2>/dev/null <"$f" || continue
		if [ ${#args[@]} -eq 0 ] || [ "${args[0]##*/}" != dockerd ]; then continue; fi
		r=/var/lib/docker
		for ((i = 1; i < ${#args[@]}; i++)); do
			case ${args[i]} in
			--data-root=* | --graph=* | -g=*) r=${args[i]#*=} ;;
			--data-root | --graph | -g) r=${args[i + 1]:-} ;;
			esac
		done
		[ "$(realpath -m "$r")" = "$root" ] && gpujob_proc_alive "$pid" && echo "$pid"
	done
	return 0
}
