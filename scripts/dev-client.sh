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

timeout=$(gpujob_dev_timeout)

# ---- the running cluster -------------------------------------------------------

dir=$(gpujob_dev_up_dir)
nomad_addr=$(gpujob_dev_env_value "$dir" NOMAD_ADDR)
consul_addr=$(gpujob_dev_env_value "$dir" CONSUL_HTTP_ADDR)
[ -n "$nomad_addr" ] || die "$dir/env names no NOMAD_ADDR"
mapfile -t nomad_tls_curl < <(gpujob_dev_curl_args "$dir" nomad tls)
mapfile -t nomad_curl < <(gpujob_dev_curl_args "$dir" nomad)
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

py=$(gpujob_python) || die "python3 is needed to read Nomad's JSON"

# ---- helpers ------------------------------------------------------------------

name_of() { echo "nomad-client-$1"; }          # PID and log file name
node_of() { echo "gpujob-dev-client-$1"; }     # Nomad node name (dev-up's client_name)
config_of() { echo "$dir/config/nomad-client-$1.hcl"; }

# agent_pid N prints client N's agent PID (its PID file, else an agent whose
# command line names its config).
agent_pid() { gpujob_dev_agent_pid "$dir" "$(name_of "$1")" "$(config_of "$1")"; }

# node_state N prints "MODIFYINDEX STATUS RAW_EXEC_HEALTHY" of client N's node
# as the server sees it ("0 absent false" before it ever registered).
node_state() {
	curl -fsS --max-time 3 "${nomad_curl[@]}" "$nomad_addr/v1/nodes" 2>/dev/null | "$py" -c '
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

# registered_ready N BEFORE succeeds once client N's node is registered
# again since the server's ModifyIndex BEFORE, ready, and raw_exec healthy;
# until then it prints how far it is.
registered_ready() {
	local state idx status raw
	if state=$(node_state "$1"); then
		read -r idx status raw <<<"$state"
		if ((idx <= $2)); then
			status="not registered again yet (the server still has it $status)"
		elif [ "$status" = ready ] && [ "$raw" != true ]; then
			status="ready, raw_exec not healthy yet"
		elif [ "$status" = ready ]; then
			return 0
		fi
	fi
	echo "not ready (node: ${status:-unknown})"
	return 1
}

# ---- actions ------------------------------------------------------------------

# stop_client N: SIGTERM to the agent alone, never its process group or
# children: a Nomad client that is not in -dev mode leaves its allocations'
# executors, logmons and tasks running when it exits, which is exactly what
# this simulates. Its plugin processes it stops itself. dev-down finds the
# tasks the client left by their cwd, not by its PID file.
stop_client() { gpujob_dev_stop "$dir" "$(name_of "$1")" "$(config_of "$1")" TERM; }

# kill_client N: SIGKILL, as a crash would. The agent gets no chance to stop
# its plugins either: besides the tasks, its driver plugin process outlives it
# (the client's next agent reattaches to it, as Nomad does after a crash), and
# dev-down collects whatever is still left.
kill_client() { gpujob_dev_kill "$dir" "$(name_of "$1")" "$(config_of "$1")"; }

# start_client N starts the agent as dev-up did and waits until the server
# has the node back: ready, raw_exec healthy, and registered again since the
# start. The last matters after a quick restart: until its heartbeat times
# out the server still shows the old agent's node as ready, and only a
# registration bumps the node's ModifyIndex.
start_client() {
	local name pid nomad state t0
	t0=$(gpujob_now_ms)
	name=$(name_of "$1")
	if pid=$(agent_pid "$1"); then
		die "$name is already running (pid $pid); use: $0 restart $1"
	fi
	# The binary the server runs is the one dev-up used (NOMAD_BIN or the
	# cached build) for every agent, whatever this shell's NOMAD_BIN says.
	nomad=$(tr '\0' '\n' <"/proc/$server_pid/cmdline" | head -n 1)
	[ -x "$nomad" ] || die "cannot tell which nomad binary the cluster runs (server pid $server_pid says '$nomad')"

	state=$(node_state "$1") || die "the Nomad server at $nomad_addr does not answer"
	gpujob_dev_restart_agent "$dir" "$nomad_addr" "$consul_addr" "$name" "$dir/client-$1" \
		"$nomad" agent -config "$(config_of "$1")"
	gpujob_dev_await "$dir" "$name" "$timeout" 0.2 "$0 stop $1" registered_ready "$1" "${state%% *}"
	echo "$name is running (pid $(<"$dir/pids/$name.pid")); node $(node_of "$1") ready after $(gpujob_elapsed "$t0")"
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
