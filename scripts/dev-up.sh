#!/usr/bin/env bash
# Starts a local gpujob cluster on loopback addresses: Consul, one Nomad server
# and GPUJOB_DEV_CLIENTS Nomad clients carrying the gpujob plugins, and returns
# once the cluster can schedule work. The agents keep running after this
# script exits; scripts/dev-down.sh stops them.
#
# Consul runs as a real server with a data directory, never `-dev` (which keeps
# everything in memory: a restart would lose every key and session, which no
# deployment does). With GPUJOB_DEV_CONSUL_SERVERS=1 (the default) that one
# server also serves the HTTP API on 127.0.0.1. With 3 it is a 3-server raft
# on 127.0.1.1-3 (clear of the Nomad clients' 127.0.0.2 and up) plus, as on a
# production node, a Consul client agent on 127.0.0.1 that serves the HTTP
# API: sessions the supervisors create are bound to that agent's node, so
# they outlive any one server. scripts/dev-consul.sh stops, kills and starts
# them one at a time.
#
# Environment (all optional):
#   GPUJOB_DEV_DIR          state dir: configs, data dirs, logs, PID files, env (/tmp/gpujob-dev)
#   GPUJOB_DEV_CLIENTS      number of Nomad clients (1); client i binds 127.0.0.(i+1)
#   GPUJOB_DEV_CONSUL_SERVERS  Consul servers (1): 1 binds 127.0.0.1; more bind
#                           127.0.1.N each and add a Consul client agent on 127.0.0.1
#   GPUJOB_DEV_BACKEND      device plugin backend, nvml or fake (nvml when an NVIDIA driver is present)
#   GPUJOB_FAKE_GPUS        GPUs per client with the fake backend (4)
#   GPUJOB_PLUGIN_DIR       where `make build` put the plugins (<checkout>/bin)
#   GPUJOB_DEV_DRIVER_CONFIG  HCL body of the task driver's plugin config block
#                           (default: checkpoint_root under the state dir, the dev Consul)
#   GPUJOB_DEV_LOG_LEVEL    agents' log level (INFO)
#   GPUJOB_DEV_TIMEOUT      seconds to wait for the cluster to be ready (90)
#   GPUJOB_DEV_PORT_OFFSET  added to every default port below (0): one variable moves
#                           a second cluster off the first one's ports
#   NOMAD_HTTP_PORT NOMAD_RPC_PORT NOMAD_SERF_PORT     4646 4647 4648 (server and every client)
#   CONSUL_HTTP_PORT CONSUL_DNS_PORT CONSUL_GRPC_PORT CONSUL_GRPC_TLS_PORT
#   CONSUL_SERVER_PORT CONSUL_SERF_LAN_PORT CONSUL_SERF_WAN_PORT
#                                                      8500 8600 8502 8503 8300 8301 8302
#                           (with several Consul servers every server uses the same
#                           numbers on its own address, and so does the client agent)
#   GPUJOB_DEV_DYN_PORTS    first dynamic task port (20000); client i gets 1000 from
#                           there on, since all clients fingerprint the same 127.0.0.1
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$here/lib.sh"

# ---- settings ----------------------------------------------------------------

dir=$(gpujob_dev_dir)
clients=${GPUJOB_DEV_CLIENTS:-1}
consul_servers=${GPUJOB_DEV_CONSUL_SERVERS:-1}
fake_gpus=${GPUJOB_FAKE_GPUS:-4}
plugin_src=${GPUJOB_PLUGIN_DIR:-$repo/bin}
log_level=${GPUJOB_DEV_LOG_LEVEL:-INFO}
timeout=${GPUJOB_DEV_TIMEOUT:-90}
off=${GPUJOB_DEV_PORT_OFFSET:-0}

for v in clients consul_servers fake_gpus timeout off; do
	[[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
# Client i binds 127.0.0.(i+1); .255 is the broadcast address.
((clients >= 1 && clients <= 253)) || die "GPUJOB_DEV_CLIENTS must be 1..253, got $clients"
((consul_servers >= 1 && consul_servers <= 9)) ||
	die "GPUJOB_DEV_CONSUL_SERVERS must be 1..9, got $consul_servers"
# The path ends up inside HCL strings, where these would need escaping.
[[ $dir != *[\"\\]* ]] || die "GPUJOB_DEV_DIR must not contain quotes or backslashes: $dir"

nomad_http=${NOMAD_HTTP_PORT:-$((4646 + off))}
nomad_rpc=${NOMAD_RPC_PORT:-$((4647 + off))}
nomad_serf=${NOMAD_SERF_PORT:-$((4648 + off))}
consul_http=${CONSUL_HTTP_PORT:-$((8500 + off))}
consul_dns=${CONSUL_DNS_PORT:-$((8600 + off))}
consul_grpc=${CONSUL_GRPC_PORT:-$((8502 + off))}
consul_grpc_tls=${CONSUL_GRPC_TLS_PORT:-$((8503 + off))}
consul_server=${CONSUL_SERVER_PORT:-$((8300 + off))}
consul_serf_lan=${CONSUL_SERF_LAN_PORT:-$((8301 + off))}
consul_serf_wan=${CONSUL_SERF_WAN_PORT:-$((8302 + off))}
dyn_ports=${GPUJOB_DEV_DYN_PORTS:-$((20000 + off))}

# The system python when there is one: a pyenv shim costs a noticeable
# fraction of a second per call, and clients_ready polls.
py=$(command -v /usr/bin/python3 || command -v python3) || die "python3 is needed to read the agents' JSON"

nomad_addr=http://127.0.0.1:$nomad_http
consul_addr=127.0.0.1:$consul_http

client_ip() { echo "127.0.0.$(($1 + 1))"; }
consul_server_ip() { gpujob_consul_server_ip "$1" "$consul_servers"; }
client_name() { echo "gpujob-dev-client-$1"; }

# ---- refuse to start on top of a running cluster -------------------------------

if [ -e "$dir" ]; then
	if [ ! -f "$dir/.gpujob-dev" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
		die "$dir exists and is not a gpujob dev state dir; set GPUJOB_DEV_DIR to another path"
	fi
	running=()
	for f in "$dir"/pids/*.pid; do
		[ -e "$f" ] || continue
		pid=$(gpujob_dev_pid "$f" "$dir") && running+=("$(basename "$f" .pid)=$pid")
	done
	if [ ${#running[@]} -gt 0 ]; then
		die "a dev cluster is already running from $dir (${running[*]}); stop it with: GPUJOB_DEV_DIR=$dir $here/dev-down.sh"
	fi
	# Left over from a crash or a failed start: clear it (unmounting what the
	# tasks mounted) so this run starts from empty data dirs.
	if [ -f "$dir/.gpujob-dev" ]; then
		log "clearing a stale state dir $dir"
		GPUJOB_DEV_DIR=$dir "$here/dev-down.sh" >/dev/null
	fi
fi

# port_busy IP PORT succeeds when something listens on PORT at IP or on a
# wildcard address (TCP or UDP: Serf and Consul's DNS use both).
port_busy() {
	if command -v ss >/dev/null; then
		ss -Hlntu 2>/dev/null | awk -v ip="$1" -v port="$2" '
			{
				n = split($5, a, ":"); p = a[n]
				host = substr($5, 1, length($5) - length(p) - 1)
				sub(/%.*/, "", host)
				if (p == port && (host == ip || host == "0.0.0.0" || host == "*" ||
					host == "[::]" || host == "[::ffff:" ip "]")) found = 1
			}
			END { exit !found }'
	else
		# Without ss only TCP can be checked: try to connect.
		(exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
	fi
}

busy=()
check_port() { # WHAT IP PORT
	if port_busy "$2" "$3"; then busy+=("$2:$3 ($1)"); fi
}
# The HTTP agent (the one server, or the client agent) on 127.0.0.1; extra
# servers on their own addresses.
for p in consul_http consul_dns consul_grpc consul_grpc_tls consul_server consul_serf_lan consul_serf_wan; do
	check_port "${p/_/ }" 127.0.0.1 "${!p}"
done
if ((consul_servers > 1)); then
	for ((i = 1; i <= consul_servers; i++)); do
		for p in consul_http consul_server consul_serf_lan consul_serf_wan; do
			check_port "consul server $i ${p#consul_}" "$(consul_server_ip "$i")" "${!p}"
		done
	done
fi
for p in nomad_http nomad_rpc nomad_serf; do
	check_port "nomad server ${p#nomad_}" 127.0.0.1 "${!p}"
done
for ((i = 1; i <= clients; i++)); do
	for p in nomad_http nomad_rpc nomad_serf; do
		check_port "nomad client $i ${p#nomad_}" "$(client_ip "$i")" "${!p}"
	done
done
if [ ${#busy[@]} -gt 0 ]; then
	printf 'error: ports already in use:\n' >&2
	printf '  %s\n' "${busy[@]}" >&2
	die "is another cluster running? Stop it, or move this one with GPUJOB_DEV_PORT_OFFSET=<n> (or NOMAD_*_PORT / CONSUL_*_PORT)"
fi

# ---- agents and plugins ----------------------------------------------------------

"$here/install-agents.sh" # a no-op when the pinned versions are cached
nomad=$(gpujob_nomad_bin)
consul=$(gpujob_consul_bin)

# Nomad launches every executable in plugin_dir as a plugin and refuses to
# start when one isn't (bin/ may also hold the gpujob CLI), so plugin_dir is
# a directory of links to exactly the plugins. Links, not copies: after
# `make build`, restarting a client picks up the new binaries.
plugins=()
for p in nomad-device-gpujob nomad-driver-gpujob; do
	[ -x "$plugin_src/$p" ] && plugins+=("$p")
done
have_plugin() { [[ " ${plugins[*]} " == *" $1 "* ]]; }

backend=${GPUJOB_DEV_BACKEND:-}
if [ -z "$backend" ]; then
	backend=fake
	# grep without -q: see gpujob_dev_pid in lib.sh (pipefail + SIGPIPE).
	if { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } | grep -F libnvidia-ml.so.1 >/dev/null &&
		[ -e /dev/nvidiactl ]; then
		backend=nvml
	fi
fi
case $backend in nvml | fake) ;; *) die "GPUJOB_DEV_BACKEND must be nvml or fake, got '$backend'" ;; esac

# With real GPUs every client on this machine would report every card, and
# the cluster would count each GPU once per client (phantom GPUs). Instead,
# deal the cards out: client i keeps every clients-th card, ignores the rest.
gpu_uuids=()
if [ "$backend" = nvml ] && ((clients > 1)) && have_plugin nomad-device-gpujob; then
	command -v nvidia-smi >/dev/null ||
		die "backend nvml with $clients clients needs nvidia-smi to share the GPUs out; use GPUJOB_DEV_CLIENTS=1 or GPUJOB_DEV_BACKEND=fake"
	mapfile -t gpu_uuids < <(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ')
	((${#gpu_uuids[@]} >= clients)) ||
		die "only ${#gpu_uuids[@]} GPUs for $clients clients; lower GPUJOB_DEV_CLIENTS"
fi
# ignored_gpus I prints the HCL list of the GPUs client I must not report.
ignored_gpus() {
	local i=$1 j out=()
	for j in "${!gpu_uuids[@]}"; do
		((j % clients == i - 1)) || out+=("\"${gpu_uuids[j]}\"")
	done
	local IFS=,
	echo "[${out[*]}]"
}

# cgroups v1: a client removes cpuset cgroups it doesn't know from under its
# cgroup parent, so clients must not share one; the name carries a hash of the
# state dir so a second cluster's clients don't share either.
tag=$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
cgroup_parent() {
	if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
		echo "gpujob-dev-$tag-client-$1.slice"
	else
		echo "/gpujob-dev-$tag-client-$1"
	fi
}

# ---- render configs --------------------------------------------------------------

mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P) # mounts and /proc show real paths; dev-down matches on them
touch "$dir/.gpujob-dev"   # marks the dir as ours: dev-down refuses to rm -rf anything else
mkdir -p "$dir"/{config,logs,pids,plugins,server,tmp}
for ((i = 1; i <= consul_servers; i++)); do mkdir -p "$dir/consul/server-$i"; done
((consul_servers == 1)) || mkdir -p "$dir/consul/client"
for p in "${plugins[@]}"; do ln -sfn "$plugin_src/$p" "$dir/plugins/$p"; done
: >"$dir/cgroup-parents"

# The commented originals of these configs are in jobspecs/agent/.
# consul_server_config N renders server N. One server alone is the agent
# everything talks to, on 127.0.0.1 with every port; one of several binds its
# own address and keeps only what a server needs (the client agent serves DNS
# and gRPC). raft_multiplier 1 is Consul's recommended production timing (the
# default 5 suits small cloud VMs): a leader is elected about a second after
# the last one is gone. min_quorum keeps autopilot from pruning a killed
# server out of the raft peers, so it comes back as the same voter instead of
# leaving a 2-server cluster that cannot lose another one.
consul_server_config() {
	local n=$1 ip join="" name=gpujob-dev j
	ip=$(consul_server_ip "$n")
	if ((consul_servers > 1)); then
		name=gpujob-dev-consul-$n
		for ((j = 1; j <= consul_servers; j++)); do
			((j == n)) || join+="${join:+, }\"$(consul_server_ip "$j"):$consul_serf_lan\""
		done
	fi
	cat <<EOF
# Rendered by scripts/dev-up.sh from jobspecs/agent/consul-server.hcl.
node_name            = "$name"
datacenter           = "dc1"
data_dir             = "$dir/consul/server-$n/data"
log_level            = "$log_level"
disable_update_check = true
server               = true
bootstrap_expect     = $consul_servers
bind_addr            = "$ip"
client_addr          = "$ip"
performance {
  raft_multiplier = 1
}
# Every agent and supervisor of the dev cluster connects from 127.0.0.1,
# where a real cluster spreads them over its nodes' addresses: Consul's
# default of 200 HTTP connections per client address would throttle (429)
# a large rendezvous, each member holding a blocking query or two.
limits {
  http_max_conns_per_client = 4096
}
ui_config {
  enabled = true
}
EOF
	if ((consul_servers > 1)); then
		cat <<EOF
retry_join     = [$join]
retry_interval = "1s"
autopilot {
  min_quorum = $consul_servers
}
ports {
  http     = $consul_http
  dns      = -1
  grpc     = -1
  grpc_tls = -1
  server   = $consul_server
  serf_lan = $consul_serf_lan
  serf_wan = $consul_serf_wan
}
EOF
	else
		cat <<EOF
ports {
  http     = $consul_http
  dns      = $consul_dns
  grpc     = $consul_grpc
  grpc_tls = $consul_grpc_tls
  server   = $consul_server
  serf_lan = $consul_serf_lan
  serf_wan = $consul_serf_wan
}
EOF
	fi
}

# consul_client_config renders the client agent of a multi-server cluster:
# the local agent every Nomad node has in production, and the one the Nomad
# agents and the supervisors talk to.
consul_client_config() {
	local join="" j
	for ((j = 1; j <= consul_servers; j++)); do
		join+="${join:+, }\"$(consul_server_ip "$j"):$consul_serf_lan\""
	done
	cat <<EOF
# Rendered by scripts/dev-up.sh from jobspecs/agent/consul-client.hcl.
node_name            = "gpujob-dev"
datacenter           = "dc1"
data_dir             = "$dir/consul/client/data"
log_level            = "$log_level"
disable_update_check = true
server               = false
# A client agent leaves the cluster on SIGTERM by default, and leaving
# invalidates every session on its node: a restart of the local agent (an
# upgrade) would then cost every supervisor its session. Production agents
# that hold sessions want the same setting.
leave_on_terminate   = false
bind_addr            = "127.0.0.1"
client_addr          = "127.0.0.1"
retry_join           = [$join]
retry_interval       = "1s"
# Every agent and supervisor of the dev cluster connects from 127.0.0.1,
# where a real cluster spreads them over its nodes' addresses: Consul's
# default of 200 HTTP connections per client address would throttle (429)
# a large rendezvous, each member holding a blocking query or two.
limits {
  http_max_conns_per_client = 4096
}
ui_config {
  enabled = true
}
ports {
  http     = $consul_http
  dns      = $consul_dns
  grpc     = $consul_grpc
  grpc_tls = $consul_grpc_tls
  serf_lan = $consul_serf_lan
  serf_wan = -1
}
EOF
}

# consul-servers: one line per server, "N IP HTTP_PORT SERVER_PORT", for
# scripts/dev-consul.sh.
: >"$dir/consul-servers"
for ((i = 1; i <= consul_servers; i++)); do
	consul_server_config "$i" >"$dir/config/consul-server-$i.hcl"
	echo "$i $(consul_server_ip "$i") $consul_http $consul_server" >>"$dir/consul-servers"
done
((consul_servers == 1)) || consul_client_config >"$dir/config/consul-client.hcl"

cat >"$dir/config/nomad-server.hcl" <<EOF
# Rendered by scripts/dev-up.sh from jobspecs/agent/nomad-server.hcl.
name                 = "gpujob-dev-server"
datacenter           = "dc1"
data_dir             = "$dir/server/data"
log_level            = "$log_level"
disable_update_check = true
bind_addr            = "127.0.0.1"
ports {
  http = $nomad_http
  rpc  = $nomad_rpc
  serf = $nomad_serf
}
advertise {
  http = "127.0.0.1:$nomad_http"
  rpc  = "127.0.0.1:$nomad_rpc"
  serf = "127.0.0.1:$nomad_serf"
}
server {
  enabled          = true
  bootstrap_expect = 1
}
client {
  enabled = false
}
consul {
  address = "$consul_addr"
}
EOF

for ((i = 1; i <= clients; i++)); do
	ip=$(client_ip "$i")
	cg=$(cgroup_parent "$i")
	echo "$cg" >>"$dir/cgroup-parents"
	mkdir -p "$dir/client-$i"
	{
		cat <<EOF
# Rendered by scripts/dev-up.sh from jobspecs/agent/nomad-client.hcl.
name                 = "$(client_name "$i")"
datacenter           = "dc1"
data_dir             = "$dir/client-$i/data"
log_level            = "$log_level"
disable_update_check = true
plugin_dir           = "$dir/plugins"
bind_addr            = "$ip"
ports {
  http = $nomad_http
  rpc  = $nomad_rpc
  serf = $nomad_serf
}
advertise {
  http = "$ip:$nomad_http"
  rpc  = "$ip:$nomad_rpc"
  serf = "$ip:$nomad_serf"
}
client {
  enabled           = true
  servers           = ["127.0.0.1:$nomad_rpc"]
  network_interface = "lo"
  min_dynamic_port  = $((dyn_ports + (i - 1) * 1000))
  max_dynamic_port  = $((dyn_ports + i * 1000 - 1))
  cgroup_parent     = "$cg"
  options {
    "driver.denylist" = "docker,qemu,java"
  }
}
consul {
  address = "$consul_addr"
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
EOF
		if have_plugin nomad-device-gpujob; then
			if [ "$backend" = nvml ] && [ ${#gpu_uuids[@]} -gt 0 ]; then
				ignored=$(ignored_gpus "$i")
			else
				ignored="[]"
			fi
			cat <<EOF
plugin "nomad-device-gpujob" {
  config {
    enabled            = true
    backend            = "$backend"
    fingerprint_period = "1m"
    ignored_gpu_ids    = $ignored
    health {
      ignored_xids = [13, 31, 43, 45, 68, 109]
    }
    fake {
      count      = $fake_gpus
      model      = "Tesla T4"
      memory_mib = 15360
      id_seed    = "client-$i"
    }
  }
}
EOF
		fi
		if have_plugin nomad-driver-gpujob; then
			# Checkpoints on the machine's own disk stand in for the shared
			# storage a real cluster mounts on every client.
			driver_config=${GPUJOB_DEV_DRIVER_CONFIG:-"    checkpoint_root = \"$dir/checkpoints\"
    consul {
      address = \"$consul_addr\"
    }"}
			cat <<EOF
plugin "nomad-driver-gpujob" {
  config {
$driver_config
  }
}
EOF
		fi
	} >"$dir/config/nomad-client-$i.hcl"
done

# ---- start ------------------------------------------------------------------------

started=()
# On any failure stop what was started, but keep the logs for a post-mortem
# (the next dev-up or dev-down clears them).
on_exit() {
	local rc=$?
	if [ "$rc" -ne 0 ] && [ ${#started[@]} -gt 0 ]; then
		log "stopping the partly started cluster; logs stay in $dir/logs"
		GPUJOB_DEV_DIR=$dir "$here/dev-down.sh" --keep-logs >/dev/null 2>&1 || true
	fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM # so the EXIT trap also runs on Ctrl-C

# start NAME DIR CMD...: gpujob_dev_start (lib.sh), with NAME recorded first
# so the EXIT trap stops it even if it never writes its PID file.
start() {
	started+=("$1")
	gpujob_dev_start "$dir" "$nomad_addr" "$consul_addr" "$@"
}

t0=$SECONDS
deadline=$((SECONDS + timeout))
consul_desc="a Consul server"
((consul_servers == 1)) || consul_desc="$consul_servers Consul servers and a Consul client agent"
log "starting $consul_desc, a Nomad server and $clients Nomad client(s) in $dir"

# fail NAME MESSAGE prints MESSAGE and the tail of NAME's log, then exits
# (the EXIT trap stops the cluster).
fail() { gpujob_dev_fail_log "$dir" "$@"; }

# wait_for WHAT NAME CHECK... polls CHECK until it succeeds; an agent that
# exits meanwhile, or the deadline, fails the start with the right log. NAME
# @lagging means the client that clients_ready last found not ready.
wait_for() {
	local what=$1 name=$2 who s
	shift 2
	until "$@"; do
		for s in "${started[@]}"; do
			gpujob_dev_pid "$dir/pids/$s.pid" "$dir" >/dev/null ||
				fail "$s" "$s exited while waiting for $what"
		done
		who=$name
		[ "$who" != @lagging ] || who=$lagging
		((SECONDS < deadline)) || fail "$who" "timed out after ${timeout}s waiting for $what"
		sleep 0.5
	done
}

# clients_ready succeeds once every client is registered, ready, and can run
# raw_exec tasks and (when it is installed) gpujob tasks; otherwise it leaves
# the first one that isn't in $lagging.
lagging="nomad-client-1"
clients_ready() {
	local body names=() i
	body=$(curl -fsS --max-time 3 "$nomad_addr/v1/nodes" 2>/dev/null) || return 1
	for ((i = 1; i <= clients; i++)); do names+=("$(client_name "$i")"); done
	lagging=$(printf '%s' "$body" | "$py" -c '
import json, sys
nodes = {n["Name"]: n for n in json.load(sys.stdin)}
drivers = sys.argv[1].split()
for name in sys.argv[2:]:
    n = nodes.get(name)
    if not (n and n["Status"] == "ready"
            and all((n.get("Drivers") or {}).get(d, {}).get("Healthy") for d in drivers)):
        print("nomad-client-" + name.rsplit("-", 1)[1])
        break
' "$drivers" "${names[@]}") || return 1
	[ -z "$lagging" ]
}

# Consul first, and ready before any Nomad agent starts: the gpujob driver
# fingerprints unhealthy while Consul has no leader, and Nomad does not
# re-evaluate a job blocked on that when the driver turns healthy 30 s later.
# The HTTP agent's node must also be in the catalog and healthy before
# anything can create a session on it (a session checks its node's
# serfHealth).
for ((i = 1; i <= consul_servers; i++)); do
	start "consul-server-$i" "$dir/consul/server-$i" "$consul" agent -config-file "$dir/config/consul-server-$i.hcl"
done
consul_http_agent="consul-server-1"
if ((consul_servers > 1)); then
	start consul-client "$dir/consul/client" "$consul" agent -config-file "$dir/config/consul-client.hcl"
	consul_http_agent="consul-client"
fi
wait_for "a Consul leader" "$consul_http_agent" gpujob_has_leader "http://$consul_addr"
wait_for "Consul's node gpujob-dev to be healthy" "$consul_http_agent" gpujob_consul_node_healthy "$consul_addr" gpujob-dev

start nomad-server "$dir/server" "$nomad" agent -config "$dir/config/nomad-server.hcl"
# The clients retry the server until it answers, so they start right away.
for ((i = 1; i <= clients; i++)); do
	start "nomad-client-$i" "$dir/client-$i" "$nomad" agent -config "$dir/config/nomad-client-$i.hcl"
done
drivers=raw_exec
have_plugin nomad-driver-gpujob && drivers+=" gpujob"
wait_for "a Nomad leader" nomad-server gpujob_has_leader "$nomad_addr"
wait_for "$clients ready Nomad client(s)" @lagging clients_ready
startup=$((SECONDS - t0))

# ---- report -----------------------------------------------------------------------

cat >"$dir/env" <<EOF
# Source this file to use the gpujob dev cluster started by scripts/dev-up.sh.
export GPUJOB_DEV_DIR='$dir'
export NOMAD_ADDR='$nomad_addr'
export CONSUL_HTTP_ADDR='$consul_addr'
export PATH='$(dirname "$nomad")':'$(dirname "$consul")':"\$PATH"
export GPUJOB_DEV_CONSUL_SERVERS='$consul_servers'
export GPUJOB_DEV_NOMAD_BIN='$nomad'
export GPUJOB_DEV_CONSUL_BIN='$consul'
EOF

# One line per client: address, drivers, GPUs.
nodes=$(curl -fsS --max-time 5 "$nomad_addr/v1/nodes?resources=true" | "$py" -c '
import json, sys
for n in sorted(json.load(sys.stdin), key=lambda n: n["Name"]):
    drivers = sorted(d for d, i in (n.get("Drivers") or {}).items() if i.get("Healthy"))
    gpus = [d for d in ((n.get("NodeResources") or {}).get("Devices") or [])
            if d.get("Type") == "gpu" and d.get("Vendor") == "nvidia"]
    count = sum(len(d.get("Instances") or []) for d in gpus)
    models = ", ".join(sorted({d.get("Name", "?") for d in gpus}))
    print("    %-22s %-15s %s  drivers: %s  nvidia/gpu: %d%s" % (
        n["Name"], n["Address"], n["ID"][:8], " ".join(drivers), count,
        " (" + models + ")" if models else ""))
')

if have_plugin nomad-device-gpujob; then
	devices="device plugin: backend $backend"
	[ "$backend" = fake ] && devices+=", $fake_gpus fake GPUs per client"
	if grep -F 'nvidia/gpu: 0' <<<"$nodes" >/dev/null; then
		log "warning: a client reports no nvidia/gpu devices; see $dir/logs/nomad-client-*.log"
	fi
else
	devices="no device plugin (no $plugin_src/nomad-device-gpujob; run make build)"
fi
have_plugin nomad-driver-gpujob || devices+="; no task driver plugin ($plugin_src/nomad-driver-gpujob)"

down=$here/dev-down.sh
[ "$dir" = /tmp/gpujob-dev ] || down="GPUJOB_DEV_DIR=$dir $down"
cat <<EOF
gpujob dev cluster is up in ${startup}s: $clients client(s), $consul_servers Consul server(s); $devices
  Nomad   $nomad_addr  (UI: $nomad_addr/ui)
  Consul  http://$consul_addr  (UI: http://$consul_addr/ui)
  nodes:
$nodes
  state:  $dir  (logs in $dir/logs)
  use it: source $dir/env
  stop:   $down
EOF
