#!/usr/bin/env bash
# Stops, kills, starts or restarts one Nomad client of the running dev cluster
# (scripts/dev-up.sh), to exercise what happens to gpujob's tasks when a
# client agent goes away: a clean shutdown or upgrade (stop/restart), or a
# crash or lost node (kill). Only the agent process is touched: Nomad clients
# leave their tasks, executors and logmons running when they exit, and a
# client started again reattaches to them. scripts/dev-down.sh still stops
# everything afterwards, whatever state a client was left in.
#
# Usage: scripts/dev-client.sh ACTION [N]
#   stop N     SIGTERM client N's agent, SIGKILL it if it is still up after 15 s
#   kill N     SIGKILL client N's agent (a crash; tasks keep running)
#   start N    start client N again as dev-up did; wait until its node is ready
#   restart N  stop N, then start N
#   status     one line per client: name, and its agent's PID or "stopped"
#
# Environment (optional):
#   GPUJOB_DEV_DIR      the cluster's state dir (/tmp/gpujob-dev)
#   GPUJOB_DEV_TIMEOUT  seconds start waits for the node to be ready (60)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

usage() { die "usage: $0 {stop|kill|start|restart} N | $0 status"; }

action=${1:-}
case $action in
stop | kill | start | restart)
	[ $# -eq 2 ] || usage
	n=$2
	[[ $n =~ ^[1-9][0-9]*$ ]] || die "client number must be a whole number from 1, got '$n'"
	;;
status) [ $# -eq 1 ] || usage ;;
*) usage ;;
esac

timeout=${GPUJOB_DEV_TIMEOUT:-60}
[[ $timeout =~ ^[0-9]+$ ]] || die "GPUJOB_DEV_TIMEOUT must be a whole number, got '$timeout'"

# ---- the running cluster -------------------------------------------------------

dir=$(gpujob_dev_dir)
[ -f "$dir/.gpujob-dev" ] || die "no dev cluster in $dir (start one with $here/dev-up.sh, or set GPUJOB_DEV_DIR)"
# dev-up records real paths (in PID files' processes, configs, TMPDIR); so
# must a client started here, or dev-down would not recognise it.
dir=$(cd "$dir" && pwd -P)
# dev-up writes env only once the whole cluster was ready, so its absence
# means a start that failed or is still under way.
[ -f "$dir/env" ] || die "the dev cluster in $dir is not up (no $dir/env): run $here/dev-up.sh"

# env_value NAME prints NAME's value from the env file dev-up wrote (lines
# export NAME='value'); read, not sourced, so nothing in it runs here.
env_value() {
	sed -n "s/^export $1='\\(.*\\)'\$/\\1/p" "$dir/env" | head -n 1
}
nomad_addr=$(env_value NOMAD_ADDR)
consul_addr=$(env_value CONSUL_HTTP_ADDR)
[ -n "$nomad_addr" ] || die "$dir/env names no NOMAD_ADDR"
[ -n "$consul_addr" ] || die "$dir/env names no CONSUL_HTTP_ADDR"

# A client can only come back (and its tasks only be kept) with a server and
# Consul to talk to.
server_pid=$(gpujob_dev_pid "$dir/pids/nomad-server.pid" "$dir") ||
	die "the dev cluster in $dir is not running (no Nomad server); start it with $here/dev-up.sh"
# The Consul agent the Nomad agents talk to: the client agent of a
# multi-server Consul, else the one server.
consul_agent=consul-server-1
[ ! -f "$dir/config/consul-client.hcl" ] || consul_agent=consul-client
gpujob_dev_pid "$dir/pids/$consul_agent.pid" "$dir" >/dev/null ||
	die "the dev cluster in $dir has no Consul agent running ($consul_agent); start it with $here/dev-consul.sh start$([ "$consul_agent" = consul-client ] && echo " client")"

# The clients are the ones dev-up rendered a config for.
clients=0
while [ -f "$dir/config/nomad-client-$((clients + 1)).hcl" ]; do clients=$((clients + 1)); done
((clients > 0)) || die "no client configs in $dir/config"
if [ -n "${n:-}" ] && ((n > clients)); then
	die "no client $n: the cluster in $dir has $clients client(s)"
fi

py=$(command -v /usr/bin/python3 || command -v python3) || die "python3 is needed to read Nomad's JSON"

# ---- helpers ------------------------------------------------------------------

name_of() { echo "nomad-client-$1"; }          # PID and log file name
node_of() { echo "gpujob-dev-client-$1"; }     # Nomad node name (dev-up's client_name)
config_of() { echo "$dir/config/nomad-client-$1.hcl"; }

# agent_pid N prints client N's agent PID. The PID file first; failing that a
# process whose command line names the client's config, so an agent whose PID
# file went missing is neither reported stopped nor started twice.
agent_pid() {
	local pid
	if pid=$(gpujob_dev_pid "$dir/pids/$(name_of "$1").pid" "$dir"); then
		echo "$pid"
		return 0
	fi
	# The pattern comes from a file: given as an argument, grep would find
	# its own command line.
	# grep without -q: see gpujob_dev_pid in lib.sh (pipefail + SIGPIPE).
	while read -r pid; do
		[ "$pid" != $$ ] || continue
		gpujob_proc_alive "$pid" || continue
		# An agent, not, say, an editor open on the config.
		tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -x agent >/dev/null || continue
		echo "$pid"
		return 0
	done < <(grep -laFf <(config_of "$1") /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3)
	return 1
}

# elapsed T0 prints the seconds since T0 (a now_ms value), to 0.1 s: a client
# restart takes a few seconds, so whole seconds would say little.
now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
elapsed() {
	local ms=$(($(now_ms) - $1))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# wait_gone SECONDS PID succeeds once PID has exited (the agent isn't our
# child, so there's no wait(1) for it).
wait_gone() {
	local end=$((SECONDS + $1))
	while gpujob_proc_alive "$2"; do
		((SECONDS < end)) || return 1
		sleep 0.1
	done
}

# node_state N prints "MODIFYINDEX STATUS RAW_EXEC_HEALTHY" of client N's node
# as the server sees it ("0 absent false" before it ever registered).
node_state() {
	curl -fsS --max-time 3 "$nomad_addr/v1/nodes" 2>/dev/null | "$py" -c '
import json, sys
for n in json.load(sys.stdin):
    if n["Name"] == sys.argv[1]:
        ok = (n.get("Drivers") or {}).get("raw_exec", {}).get("Healthy")
        print(n["ModifyIndex"], n["Status"], "true" if ok else "false")
        break
else:
    print(0, "absent", "false")
' "$(node_of "$1")"
}

fail_log() { # N MESSAGE: MESSAGE and the tail of client N's log, then exit 1
	local log
	log="$dir/logs/$(name_of "$1").log"
	printf 'error: %s\n' "$2" >&2
	printf -- '---- last 40 lines of %s ----\n' "$log" >&2
	tail -n 40 "$log" >&2 || true
	printf -- '----\n' >&2
	exit 1
}

# ---- actions ------------------------------------------------------------------

# stop_client N: SIGTERM to the agent alone, never its process group or
# children: a Nomad client that is not in -dev mode leaves its allocations'
# executors, logmons and tasks running when it exits, which is exactly what
# this simulates. Its plugin processes it stops itself.
stop_client() {
	local pid t0
	t0=$(now_ms)
	if ! pid=$(agent_pid "$1"); then
		log "$(name_of "$1") is already stopped"
		rm -f "$dir/pids/$(name_of "$1").pid"
		return 0
	fi
	log "stopping $(name_of "$1") (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	if ! wait_gone 15 "$pid"; then
		log "$(name_of "$1") still running after 15s, killing it"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone 5 "$pid" || die "$(name_of "$1") (pid $pid) survived SIGKILL"
	fi
	# Gone, so dev-up's PID file is stale: status says stopped, and start may
	# go. dev-down finds the tasks the client left by their cwd, not by it.
	rm -f "$dir/pids/$(name_of "$1").pid"
	log "$(name_of "$1") stopped in $(elapsed "$t0")"
}

# kill_client N: SIGKILL, as a crash would. The agent gets no chance to stop
# its plugins either: besides the tasks, its driver plugin process outlives it
# (the client's next agent reattaches to it, as Nomad does after a crash), and
# dev-down collects whatever is still left.
kill_client() {
	local pid
	if ! pid=$(agent_pid "$1"); then
		log "$(name_of "$1") is already stopped"
		rm -f "$dir/pids/$(name_of "$1").pid"
		return 0
	fi
	log "killing $(name_of "$1") (pid $pid)"
	kill -KILL "$pid" 2>/dev/null || true
	wait_gone 5 "$pid" || die "$(name_of "$1") (pid $pid) survived SIGKILL"
	rm -f "$dir/pids/$(name_of "$1").pid"
}

# start_client N starts the agent as dev-up did (gpujob_dev_start: same
# binary, config, cwd, environment, session, PID file and log) and waits
# until the server has the node back: ready, raw_exec healthy, and
# registered again since the start. The last matters after a quick restart:
# until its heartbeat times out the server still shows the old agent's node
# as ready, and only a registration bumps the node's ModifyIndex.
start_client() {
	local name pid nomad before state idx status raw t0
	t0=$(now_ms)
	name=$(name_of "$1")
	if pid=$(agent_pid "$1"); then
		die "$name is already running (pid $pid); use: $0 restart $1"
	fi
	# The binary the server runs is the one dev-up used (NOMAD_BIN or the
	# cached build) for every agent, whatever this shell's NOMAD_BIN says.
	nomad=$(tr '\0' '\n' <"/proc/$server_pid/cmdline" | head -n 1)
	[ -x "$nomad" ] || die "cannot tell which nomad binary the cluster runs (server pid $server_pid says '$nomad')"

	state=$(node_state "$1") || die "the Nomad server at $nomad_addr does not answer"
	before=${state%% *}
	printf '\n==> %s: %s started again by %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" "$name" "$(basename "$0")" \
		>>"$dir/logs/$name.log"
	log "starting $name"
	gpujob_dev_start "$dir" "$nomad_addr" "$consul_addr" "$name" "$dir/client-$1" \
		"$nomad" agent -config "$(config_of "$1")"
	pid=$(<"$dir/pids/$name.pid")

	local deadline=$((SECONDS + timeout))
	while :; do
		if state=$(node_state "$1"); then
			read -r idx status raw <<<"$state"
			if ((idx <= before)); then
				status="not registered again yet (the server still has it $status)"
			elif [ "$status" = ready ] && [ "$raw" != true ]; then
				status="ready, raw_exec not healthy yet"
			elif [ "$status" = ready ]; then
				break
			fi
		fi
		gpujob_proc_alive "$pid" || fail_log "$1" "$name exited while starting"
		((SECONDS < deadline)) ||
			fail_log "$1" "$name (pid $pid) not ready after ${timeout}s (node: ${status:-unknown}); it is left running, stop it with: $0 stop $1"
		sleep 0.2
	done
	echo "$name is running (pid $pid); node $(node_of "$1") ready after $(elapsed "$t0")"
}

case $action in
stop) stop_client "$n" ;;
kill) kill_client "$n" ;;
start) start_client "$n" ;;
restart)
	stop_client "$n"
	start_client "$n"
	;;
status)
	for ((i = 1; i <= clients; i++)); do
		pid=$(agent_pid "$i") || pid=stopped
		printf '%s %s\n' "$(name_of "$i")" "$pid"
	done
	;;
esac
