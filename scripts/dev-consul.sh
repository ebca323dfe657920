#!/usr/bin/env bash
# Stops, kills, starts or restarts one Consul agent of the running dev cluster
# (scripts/dev-up.sh), to exercise what gpujob's rendezvous does when Consul
# goes away: a clean restart or upgrade of the one server (stop/restart), a
# crash (kill), or the loss of the raft leader of a multi-server Consul
# (`kill leader`). Every agent keeps its data dir, so what it held (keys,
# sessions) is there again when it is started, as on a real server.
#
# Usage: scripts/dev-consul.sh ACTION [TARGET]
#   stop [T]     SIGTERM the agent, SIGKILL it if it is still up after 15 s
#   kill [T]     SIGKILL the agent (a crash)
#   start [T]    start it again as dev-up did; wait until it has a leader again
#                (and, for a server, until autopilot counts it healthy). Without T
#                on a multi-server Consul: every agent that is stopped
#   restart [T]  stop, then start
#   status       one line per agent: name, PID or "stopped", and which is leader
#   leader       print the number of the server that leads now
# TARGET: N, server number N (default: the server, when there is one);
#   `leader`, the server that leads now (resolved once, before acting; so
#   `kill leader` says which number it killed, for a later `start N`);
#   `client`, the client agent of a multi-server Consul (GPUJOB_DEV_CONSUL_SERVERS>1).
#
# Environment (optional):
#   GPUJOB_DEV_DIR      the cluster's state dir (/tmp/gpujob-dev)
#   GPUJOB_DEV_TIMEOUT  seconds start waits for a leader (60)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

usage() { die "usage: $0 {stop|kill|start|restart} [N|leader|client] | $0 status | $0 leader"; }

action=${1:-}
target=${2:-}
case $action in
stop | kill | start | restart) [ $# -le 2 ] || usage ;;
status | leader) [ $# -eq 1 ] || usage ;;
*) usage ;;
esac

timeout=$(gpujob_dev_timeout)

# ---- the running cluster -------------------------------------------------------

dir=$(gpujob_dev_up_dir)
[ -f "$dir/consul-servers" ] || die "$dir has no consul-servers file: it was started by an older dev-up.sh; restart it"

nomad_addr=$(gpujob_dev_env_value "$dir" NOMAD_ADDR)
consul_addr=$(gpujob_dev_env_value "$dir" CONSUL_HTTP_ADDR)
consul=$(gpujob_dev_env_value "$dir" GPUJOB_DEV_CONSUL_BIN)
[ -n "$consul_addr" ] || die "$dir/env names no CONSUL_HTTP_ADDR"
# With TLS the env file's address carries https://; the agents are given it
# as it is, the checks below add the scheme to each host:port.
consul_env_addr=$consul_addr
consul_addr=${consul_addr#*://}
scheme=$(gpujob_dev_scheme "$dir")
mapfile -t tls_curl < <(gpujob_dev_curl_args "$dir" consul tls)
mapfile -t consul_curl < <(gpujob_dev_curl_args "$dir" consul)
[ -x "$consul" ] || die "$dir/env names no runnable GPUJOB_DEV_CONSUL_BIN ('$consul')"

# The servers dev-up rendered: "N IP HTTP_PORT SERVER_PORT" per line.
declare -A server_http server_rpc
servers=0
while read -r n ip http rpc; do
	server_http[$n]=$ip:$http server_rpc[$n]=$ip:$rpc
	servers=$((servers + 1))
done <"$dir/consul-servers"
((servers > 0)) || die "$dir/consul-servers lists no server"
has_client=0
[ ! -f "$dir/config/consul-client.hcl" ] || has_client=1

py=$(gpujob_python) || die "python3 is needed to read Consul's JSON"

# ---- helpers ------------------------------------------------------------------

# leader_number prints the number of the server that leads now, as the HTTP
# agent (or, with it down, any live server) sees it.
leader_number() {
	local addr leader n
	for addr in "$consul_addr" "${server_http[@]}"; do
		leader=$(curl -fsS --max-time 2 "${tls_curl[@]}" "$scheme://$addr/v1/status/leader" 2>/dev/null | tr -d '"') || continue
		[ -n "$leader" ] || continue
		for n in "${!server_rpc[@]}"; do
			if [ "${server_rpc[$n]}" = "$leader" ]; then
				echo "$n"
				return 0
			fi
		done
		die "the leader $leader is none of this cluster's servers (${server_rpc[*]})"
	done
	return 1
}

# Resolve the target to an agent: name (PID and log file), config, HTTP address.
resolve() {
	case $1 in
	"")
		((servers == 1)) || die "this Consul has $servers servers: say which (1..$servers, leader or client)"
		resolve 1
		;;
	leader)
		local n
		n=$(leader_number) || die "Consul has no leader now"
		log "server $n leads"
		resolve "$n"
		;;
	client)
		((has_client)) || die "this Consul has no client agent (it has one only with GPUJOB_DEV_CONSUL_SERVERS > 1)"
		name=consul-client wd=$dir/consul/client http=$consul_addr server_name=""
		;;
	*)
		[[ $1 =~ ^[1-9][0-9]*$ ]] || die "target must be a server number, leader or client, got '$1'"
		(($1 <= servers)) || die "no server $1: this Consul has $servers server(s)"
		name=consul-server-$1 wd=$dir/consul/server-$1 http=${server_http[$1]} server_name=gpujob-dev-consul-$1
		((servers > 1)) || server_name=gpujob-dev
		;;
	esac
	config=$dir/config/$name.hcl
}

# agent_pid prints the agent's PID: its PID file, else a consul agent whose
# command line names its config (one whose PID file went missing).
agent_pid() { gpujob_dev_agent_pid "$dir" "$name" "$config"; }

# server_healthy NAME succeeds when the leader's autopilot counts server NAME
# healthy: alive in Serf and its raft log caught up with the leader's.
server_healthy() {
	local body
	body=$(curl -fsS --max-time 2 "${consul_curl[@]}" "$scheme://$consul_addr/v1/operator/autopilot/health" 2>/dev/null) || return 1
	printf '%s' "$body" | "$py" -c '
import json, sys
h = json.load(sys.stdin)
sys.exit(0 if any(s["Name"] == sys.argv[1] and s["Healthy"] for s in h.get("Servers") or []) else 1)
' "$1"
}

# started_ready succeeds once the cluster works again through the agent
# started: it knows a leader, the HTTP agent's node is healthy (sessions can
# be made on it), and a server is counted healthy by autopilot. Until then it
# prints what it still waits for.
started_ready() {
	if ! gpujob_has_leader "$scheme://$http" "${tls_curl[@]}"; then
		echo "still waiting for a leader"
	elif ! gpujob_consul_node_healthy "$scheme://$consul_addr" gpujob-dev "${consul_curl[@]}"; then
		echo "still waiting for node gpujob-dev healthy"
	elif [ "$name" != consul-client ] && ((servers > 1)) && ! server_healthy "$server_name"; then
		echo "still waiting for autopilot to count $server_name healthy"
	else
		return 0
	fi
	return 1
}

# ---- actions ------------------------------------------------------------------

# stop_agent: SIGTERM. A server does not leave the cluster on SIGTERM
# (leave_on_terminate is off for servers), so it stays a raft voter and comes
# back as itself: a restart, not a removal.
stop_agent() { gpujob_dev_stop "$dir" "$name" "$config" TERM; }

kill_agent() { gpujob_dev_kill "$dir" "$name" "$config" "${server_name:+, server ${name##*-}}"; }

# start_agent runs the agent as dev-up did and waits until the cluster works
# again through it (started_ready).
start_agent() {
	local pid t0
	t0=$(gpujob_now_ms)
	if pid=$(agent_pid); then
		die "$name is already running (pid $pid); use: $0 restart ${target:-}"
	fi
	gpujob_dev_restart_agent "$dir" "$nomad_addr" "$consul_env_addr" "$name" "$wd" "$consul" agent -config-file "$config"
	gpujob_dev_await "$dir" "$name" "$timeout" 0.1 "$0 stop ${target:-}" started_ready
	echo "$name is running (pid $(<"$dir/pids/$name.pid")); Consul has a leader again after $(gpujob_elapsed "$t0")"
}

case $action in
status)
	lead=$(leader_number 2>/dev/null) || lead=""
	for ((i = 1; i <= servers; i++)); do
		resolve "$i"
		pid=$(agent_pid) || pid=stopped
		printf '%s %s%s\n' "$name" "$pid" "$([ "$lead" = "$i" ] && echo ' leader')"
	done
	if ((has_client)); then
		resolve client
		pid=$(agent_pid) || pid=stopped
		printf '%s %s\n' "$name" "$pid"
	fi
	;;
leader) leader_number || die "Consul has no leader now" ;;
start)
	if [ -z "$target" ] && ((servers > 1)); then
		any=0
		for t in $(seq 1 "$servers") client; do
			[ "$t" != client ] || ((has_client)) || continue
			resolve "$t"
			agent_pid >/dev/null && continue
			start_agent
			any=1
		done
		((any)) || log "every Consul agent is running"
	else
		[ "$target" != leader ] || die "the leader is running; say which server to start (kill leader says which it killed)"
		resolve "$target"
		start_agent
	fi
	;;
*)
	resolve "$target"
	case $action in
	stop) stop_agent ;;
	kill) kill_agent ;;
	restart)
		stop_agent
		start_agent
		;;
	esac
	;;
esac
