#!/usr/bin/env bash
# Stops, kills, starts or restarts the Nomad server of the running dev cluster
# (scripts/dev-up.sh): an upgrade or crash of the scheduler while jobs run. The
# server keeps its data dir (raft log and snapshots), so it comes back with
# every job, allocation and node it had; clients keep their tasks running
# meanwhile and register again once it answers.
#
# Usage: scripts/dev-nomad.sh ACTION
#   stop     SIGTERM the server, SIGKILL it if it is still up after 15 s
#   kill     SIGKILL the server (a crash)
#   start    start it again as dev-up did; wait until it leads and every
#            client that is running is ready again
#   restart  stop, then start
#   status   the server's PID or "stopped"
#
# Environment (optional):
#   GPUJOB_DEV_DIR      the cluster's state dir (/tmp/gpujob-dev)
#   GPUJOB_DEV_TIMEOUT  seconds start waits (60)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

action=${1:-}
case $action in
stop | kill | start | restart | status) [ $# -eq 1 ] || die "usage: $0 {stop|kill|start|restart|status}" ;;
*) die "usage: $0 {stop|kill|start|restart|status}" ;;
esac

timeout=${GPUJOB_DEV_TIMEOUT:-60}
[[ $timeout =~ ^[0-9]+$ ]] || die "GPUJOB_DEV_TIMEOUT must be a whole number, got '$timeout'"

dir=$(gpujob_dev_dir)
[ -f "$dir/.gpujob-dev" ] || die "no dev cluster in $dir (start one with $here/dev-up.sh, or set GPUJOB_DEV_DIR)"
dir=$(cd "$dir" && pwd -P) # dev-up records real paths; see dev-client.sh
[ -f "$dir/env" ] || die "the dev cluster in $dir is not up (no $dir/env): run $here/dev-up.sh"
env_value() { sed -n "s/^export $1='\\(.*\\)'\$/\\1/p" "$dir/env" | head -n 1; }
nomad_addr=$(env_value NOMAD_ADDR)
consul_addr=$(env_value CONSUL_HTTP_ADDR)
nomad=$(env_value GPUJOB_DEV_NOMAD_BIN)
[ -n "$nomad_addr" ] || die "$dir/env names no NOMAD_ADDR"
[ -x "$nomad" ] || die "$dir/env names no runnable GPUJOB_DEV_NOMAD_BIN ('$nomad')"
py=$(command -v /usr/bin/python3 || command -v python3) || die "python3 is needed to read Nomad's JSON"

name=nomad-server
config=$dir/config/nomad-server.hcl

server_pid() { gpujob_dev_pid "$dir/pids/$name.pid" "$dir"; }

now_ms() { echo $((${EPOCHREALTIME/./} / 1000)); }
elapsed() {
	local ms=$(($(now_ms) - $1))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}
wait_gone() { # SECONDS PID
	local end=$((SECONDS + $1))
	while gpujob_proc_alive "$2"; do
		((SECONDS < end)) || return 1
		sleep 0.1
	done
}

# running_clients prints the node names of the clients whose agent runs.
running_clients() {
	local f n
	for f in "$dir"/pids/nomad-client-*.pid; do
		[ -e "$f" ] || continue
		gpujob_dev_pid "$f" "$dir" >/dev/null || continue
		n=${f##*/nomad-client-}
		echo "gpujob-dev-client-${n%.pid}"
	done
}

# clients_ready succeeds once every running client's node is ready.
clients_ready() {
	local names
	mapfile -t names < <(running_clients)
	[ ${#names[@]} -gt 0 ] || return 0
	curl -fsS --max-time 3 "$nomad_addr/v1/nodes" 2>/dev/null | "$py" -c '
import json, sys
ready = {n["Name"] for n in json.load(sys.stdin) if n["Status"] == "ready"}
sys.exit(0 if set(sys.argv[1:]) <= ready else 1)
' "${names[@]}"
}

stop_server() { # SIGNAL
	local pid t0
	t0=$(now_ms)
	if ! pid=$(server_pid); then
		log "$name is already stopped"
		rm -f "$dir/pids/$name.pid"
		return 0
	fi
	log "stopping $name (pid $pid) with SIG$1"
	kill "-$1" "$pid" 2>/dev/null || true
	if ! wait_gone 15 "$pid"; then
		log "$name still running after 15s, killing it"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone 5 "$pid" || die "$name (pid $pid) survived SIGKILL"
	fi
	rm -f "$dir/pids/$name.pid"
	log "$name stopped in $(elapsed "$t0")"
}

start_server() {
	local pid t0 what
	t0=$(now_ms)
	if pid=$(server_pid); then
		die "$name is already running (pid $pid); use: $0 restart"
	fi
	printf '\n==> %s: %s started again by %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" "$name" "$(basename "$0")" \
		>>"$dir/logs/$name.log"
	log "starting $name"
	gpujob_dev_start "$dir" "$nomad_addr" "$consul_addr" "$name" "$dir/server" "$nomad" agent -config "$config"
	pid=$(<"$dir/pids/$name.pid")
	local deadline=$((SECONDS + timeout))
	while :; do
		if ! gpujob_has_leader "$nomad_addr"; then
			what="a leader"
		elif ! clients_ready; then
			what="the running clients to be ready"
		else
			break
		fi
		if ! gpujob_proc_alive "$pid"; then
			printf -- '---- last 40 lines of %s ----\n' "$dir/logs/$name.log" >&2
			tail -n 40 "$dir/logs/$name.log" >&2 || true
			die "$name exited while starting"
		fi
		((SECONDS < deadline)) || die "$name (pid $pid) still waiting for $what after ${timeout}s (log: $dir/logs/$name.log)"
		sleep 0.2
	done
	echo "$name is running (pid $pid); it leads and its clients are ready after $(elapsed "$t0")"
}

case $action in
stop) stop_server TERM ;;
kill) stop_server KILL ;;
start) start_server ;;
restart)
	stop_server TERM
	start_server
	;;
status)
	pid=$(server_pid) || pid=stopped
	echo "$name $pid"
	;;
esac
