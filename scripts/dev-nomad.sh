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

timeout=$(gpujob_dev_timeout)

dir=$(gpujob_dev_up_dir)
nomad_addr=$(gpujob_dev_env_value "$dir" NOMAD_ADDR)
consul_addr=$(gpujob_dev_env_value "$dir" CONSUL_HTTP_ADDR)
nomad=$(gpujob_dev_env_value "$dir" GPUJOB_DEV_NOMAD_BIN)
[ -n "$nomad_addr" ] || die "$dir/env names no NOMAD_ADDR"
mapfile -t nomad_tls_curl < <(gpujob_dev_curl_args "$dir" nomad tls)
mapfile -t nomad_curl < <(gpujob_dev_curl_args "$dir" nomad)
[ -x "$nomad" ] || die "$dir/env names no runnable GPUJOB_DEV_NOMAD_BIN ('$nomad')"
py=$(gpujob_python) || die "python3 is needed to read Nomad's JSON"

name="nomad-server"
config=$dir/config/nomad-server.hcl

server_pid() { gpujob_dev_agent_pid "$dir" "$name"; }

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
	curl -fsS --max-time 3 "${nomad_curl[@]}" "$nomad_addr/v1/nodes" 2>/dev/null | "$py" -c '
import json, sys
ready = {n["Name"] for n in json.load(sys.stdin) if n["Status"] == "ready"}
sys.exit(0 if set(sys.argv[1:]) <= ready else 1)
' "${names[@]}"
}

# started_ready succeeds once the server leads and every running client is
# ready again; until then it prints what it still waits for.
started_ready() {
	if ! gpujob_has_leader "$nomad_addr" "${nomad_tls_curl[@]}"; then
		echo "still waiting for a leader"
	elif ! clients_ready; then
		echo "still waiting for the running clients to be ready"
	else
		return 0
	fi
	return 1
}

# stop_server SIGNAL: the PID file alone finds the server.
stop_server() { gpujob_dev_stop "$dir" "$name" "" "$1" " with SIG$1"; }

start_server() {
	local pid t0
	t0=$(gpujob_now_ms)
	if pid=$(server_pid); then
		die "$name is already running (pid $pid); use: $0 restart"
	fi
	gpujob_dev_restart_agent "$dir" "$nomad_addr" "$consul_addr" "$name" "$dir/server" "$nomad" agent -config "$config"
	gpujob_dev_await "$dir" "$name" "$timeout" 0.2 "$0 stop" started_ready
	echo "$name is running (pid $(<"$dir/pids/$name.pid")); it leads and its clients are ready after $(gpujob_elapsed "$t0")"
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
