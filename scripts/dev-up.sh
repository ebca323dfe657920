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
#   GPUJOB_DEV_ACL          1: Nomad and Consul ACLs, default deny, bootstrapped here; the
#                           policies of jobspecs/acl/, one token each (0)
#   GPUJOB_DEV_TLS          1: HTTPS and mutual TLS for every Nomad and Consul API and RPC,
#                           with a CA made here for this cluster (0)
#   GPUJOB_DEV_DOCKER       1: start a dockerd of the cluster's own (Debian's docker.io: socket,
#                           exec-root and log under the state dir, data-root in the agent cache)
#                           and enable Nomad's docker driver in every client (0)
#   GPUJOB_DEV_DOCKER_ROOT  that dockerd's data-root (<agent cache>/docker/data): its images
#                           outlive the cluster; one dockerd at a time may use it
#   GPUJOB_DEV_DOCKER_STORAGE_DRIVER  its storage driver (overlay2; vfs where the data-root's
#                           filesystem cannot hold overlay2, e.g. itself an overlay)
#   GPUJOB_DOCKERD GPUJOB_DOCKER_CLI  the daemon and client (/usr/sbin/dockerd, /usr/bin/docker)
#   GPUJOB_FAKE_GPUS        GPUs per client with the fake backend (4)
#   GPUJOB_PLUGIN_DIR       where `make build` put the plugins (<checkout>/bin)
#   GPUJOB_DEV_DRIVER_CONFIG  HCL body of the task driver's plugin config block
#                           (default: checkpoint_root under the state dir, container_supervisor
#                           = <plugin dir>/gpujob-supervisor, host_env = the driver's default
#                           and OPENBLAS_*, the dev Consul with,
#                           in the ACL and TLS modes, the driver's token and certificates;
#                           tasks run as the driver's default_user, nobody, and root is refused)
#   GPUJOB_DEV_DRIVER_EXTRA   HCL appended to that body (e.g. namespace_users, pids_limit)
#   GPUJOB_DEV_NOMAD_SERVER_EXTRA  HCL added to the Nomad server's server block (e.g.
#                           heartbeat_grace and min_heartbeat_ttl: the e2e node-loss tests'
#                           cluster notices a lost client in seconds, not Nomad's 20-30)
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
#   GPUJOB_DEV_GATEWAY      0: no gpujob gateway; 1 (the default): run one as a Nomad job
#                           (gpujob gateway render), on GPUJOB_DEV_GATEWAY_PORT (8080)
#   GPUJOB_DEV_EXPORTER     0: no gpujob exporter; 1 (the default): run it as a Nomad system
#                           job (gpujob exporter render) on GPUJOB_DEV_EXPORTER_PORT (9400)
#                           with one client, on a port Nomad picks with several; with ACLs
#                           or TLS as the user gpujob-exporter, with read-only tokens of its
#                           own from the variable nomad/jobs/gpujob-exporter (--secrets)
#   GPUJOB_DEV_DYN_PORTS_PER_CLIENT  dynamic task ports per client (1000)
#   GPUJOB_DEV_CPU_MHZ      the CPU every client offers Nomad, in MHz (cpu_total_compute);
#                           empty (the default): what Nomad fingerprints, cores x clock, the
#                           whole machine for each client. The e2e tests set it, so that what
#                           fits on a client does not depend on the machine's clock
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

acl=${GPUJOB_DEV_ACL:-0}
tls=${GPUJOB_DEV_TLS:-0}
docker=${GPUJOB_DEV_DOCKER:-0}
gateway=${GPUJOB_DEV_GATEWAY:-1}
exporter=${GPUJOB_DEV_EXPORTER:-1}

for v in clients consul_servers fake_gpus timeout off; do
	[[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
[[ $acl =~ ^[01]$ ]] || die "GPUJOB_DEV_ACL must be 0 or 1, got '$acl'"
[[ $tls =~ ^[01]$ ]] || die "GPUJOB_DEV_TLS must be 0 or 1, got '$tls'"
[[ $docker =~ ^[01]$ ]] || die "GPUJOB_DEV_DOCKER must be 0 or 1, got '$docker'"
[[ $gateway =~ ^[01]$ ]] || die "GPUJOB_DEV_GATEWAY must be 0 or 1, got '$gateway'"
[[ $exporter =~ ^[01]$ ]] || die "GPUJOB_DEV_EXPORTER must be 0 or 1, got '$exporter'"
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
dyn_per_client=${GPUJOB_DEV_DYN_PORTS_PER_CLIENT:-1000}
cpu_mhz=${GPUJOB_DEV_CPU_MHZ:-}
[[ -z $cpu_mhz || $cpu_mhz =~ ^[1-9][0-9]*$ ]] || die "GPUJOB_DEV_CPU_MHZ must be a whole number of MHz, got '$cpu_mhz'"
[[ $dyn_per_client =~ ^[0-9]+$ ]] && ((dyn_per_client >= 100)) ||
	die "GPUJOB_DEV_DYN_PORTS_PER_CLIENT must be a whole number of at least 100, got '$dyn_per_client'"
gateway_port=${GPUJOB_DEV_GATEWAY_PORT:-$((8080 + off))}
exporter_port=${GPUJOB_DEV_EXPORTER_PORT:-$((9400 + off))}
# Task ports inside the kernel's ephemeral range can be taken by any
# outgoing connection's local port; torch's rank 0 then fails to bind its
# MASTER_PORT ("Address already in use") at every restart.
if read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null &&
	((dyn_ports + clients * dyn_per_client - 1 >= eph_lo)); then
	echo "dev-up: warning: dynamic task ports $dyn_ports-$((dyn_ports + clients * dyn_per_client - 1)) reach into the" \
		"ephemeral port range ($eph_lo up): set GPUJOB_DEV_DYN_PORTS lower" >&2
fi

# The system python when there is one: a pyenv shim costs a noticeable
# fraction of a second per call, and clients_ready polls.
py=$(command -v /usr/bin/python3 || command -v python3) || die "python3 is needed to read the agents' JSON"

scheme=http
((tls)) && scheme=https
nomad_addr=$scheme://127.0.0.1:$nomad_http
# consul_addr is host:port (what the agents' consul blocks take); consul_url
# has the scheme. Without TLS the env file keeps the bare host:port, as
# before; with TLS it says https://, which the consul CLI and API read.
consul_addr=127.0.0.1:$consul_http
consul_url=$scheme://$consul_addr
consul_env_addr=$consul_addr
((tls)) && consul_env_addr=$consul_url

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

# ---- docker (GPUJOB_DEV_DOCKER=1): checks before anything starts ----------------

if ((docker)); then
	dockerd_bin=$(gpujob_dockerd_bin)
	docker_cli=$(gpujob_docker_cli)
	[ "$(id -u)" = 0 ] || die "GPUJOB_DEV_DOCKER=1 needs root (dockerd does)"
	for b in "$dockerd_bin" "$docker_cli"; do
		[ -x "$b" ] || die "GPUJOB_DEV_DOCKER=1: no $b (Debian's docker.io; scripts/install-deps.sh installs it)"
	done
	for b in containerd runc; do
		command -v "$b" >/dev/null ||
			die "GPUJOB_DEV_DOCKER=1: no $b on PATH (Debian's docker.io brings it; scripts/install-deps.sh installs it)"
	done
	docker_root=$(gpujob_docker_root)
	mkdir -p "$docker_root"
	docker_root=$(cd "$docker_root" && pwd -P)
	mapfile -t holders < <(gpujob_dockerd_on "$docker_root")
	if [ ${#holders[@]} -gt 0 ]; then
		holder_cmd=$(tr '\0' ' ' <"/proc/${holders[0]}/cmdline" 2>/dev/null || true)
		holder_dir=""
		[[ $holder_cmd =~ --exec-root\ ([^ ]*)/docker/exec ]] && holder_dir=${BASH_REMATCH[1]}
		hint="stop it"
		[ -z "$holder_dir" ] || hint="stop its dev cluster (GPUJOB_DEV_DIR=$holder_dir $here/dev-down.sh)"
		die "the docker data-root $docker_root is in use by dockerd pid ${holders[*]} ($holder_cmd); one dockerd at a time can use it: $hint, or give this cluster another with GPUJOB_DEV_DOCKER_ROOT=<dir>"
	fi
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
supervisor_bin=$(cd "$plugin_src" 2>/dev/null && pwd -P || echo "$plugin_src")/gpujob-supervisor

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

# fake_gpu_nodes I makes look-alike device nodes for client I's fake GPUs
# (DIR/dev/nvidiaN, 195:N, as the NVIDIA driver's) and prints DIR, the fake
# backend's dev_root: reservations then carry them and the gpujob driver
# closes the other GPUs' nodes to a task's ranks through the device cgroup,
# which opening them shows (EPERM; a task's own fails further on, ENXIO,
# with no driver behind). Needs root; prints nothing without.
fake_gpu_nodes() {
	local root=$dir/client-$1/fakedev j
	[ "$backend" = fake ] && [ "$(id -u)" = 0 ] || return 0
	mkdir -p "$root/dev"
	for ((j = 0; j < fake_gpus; j++)); do
		mknod -m 0666 "$root/dev/nvidia$j" c 195 "$j" 2>/dev/null || return 0
	done
	echo "$root"
}

# ---- render configs --------------------------------------------------------------

mkdir -p "$dir"
dir=$(cd "$dir" && pwd -P) # mounts and /proc show real paths; dev-down matches on them
touch "$dir/.gpujob-dev"   # marks the dir as ours: dev-down refuses to rm -rf anything else
mkdir -p "$dir"/{config,logs,pids,plugins,server,tmp}
# The gpujob driver runs the ranks as nobody (its default_user): they must
# reach their task directories and checkpoints under the state dir, and read
# the workloads, which a checkout in a private home directory would hide. So
# the state dir is traversable by all (whatever the umask), and the
# workloads are copied into it, readable by all (GPUJOB_DEV_WORKLOADS).
chmod 0755 "$dir"
rm -rf "$dir/workloads"
cp -R "$repo/jobspecs/workloads" "$dir/workloads"
chmod -R a+rX "$dir/workloads"
# A sweep's controller job runs the gpujob CLI as nobody too: a copy here,
# which `gpujob sweep submit` finds through GPUJOB_CONTROLLER_BINARY.
rm -rf "$dir/bin"
mkdir -p "$dir/bin"
if [ -x "$plugin_src/gpujob" ]; then
	install -m 0755 "$plugin_src/gpujob" "$dir/bin/gpujob"
fi
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
	! setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups test -r "$dir/workloads/bert_finetune.py"; then
	die "user nobody cannot reach $dir (a directory above it is private); the gpujob tasks run as nobody: set GPUJOB_DEV_DIR to a path under /tmp"
fi
# With ACLs a sweep's controller holds tokens of its own and runs as a user
# no workload runs as (cli/sweepcreds.ControllerUser): make it once.
if ((acl)) && ! id gpujob-sweep >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpujob-sweep ||
			die "could not create the user gpujob-sweep (a sweep controller's user with ACLs)"
	else
		echo "dev-up: warning: no user gpujob-sweep: with ACLs, sweep controllers run as it; create it as root:" \
			"useradd --system --no-create-home --shell /usr/sbin/nologin gpujob-sweep" >&2
	fi
fi
# So do the exporters, with ACLs or TLS (cli/render.DefaultExporterUser).
if ((acl || tls)) && ((exporter)) && ! id gpujob-exporter >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpujob-exporter ||
			die "could not create the user gpujob-exporter (the exporters' user with ACLs or TLS)"
	else
		echo "dev-up: warning: no user gpujob-exporter: with ACLs or TLS, the exporters run as it; create it as root:" \
			"useradd --system --no-create-home --shell /usr/sbin/nologin gpujob-exporter" >&2
	fi
fi
# So does the queue's admission controller, with ACLs or TLS
# (cli/render.DefaultQueueControllerUser), once `gpujob queue apply` starts it.
if ((acl || tls)) && ! id gpujob-queue >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpujob-queue ||
			die "could not create the user gpujob-queue (the queue controller's user with ACLs or TLS)"
	else
		echo "dev-up: warning: no user gpujob-queue: with ACLs or TLS, the queue controller runs as it; create it as root:" \
			"useradd --system --no-create-home --shell /usr/sbin/nologin gpujob-queue" >&2
	fi
fi
# With ACLs the gateways hold tokens too: a user of their own, for the same
# reason (cli/render.DefaultGatewayUser).
if ((acl && gateway)) && ! id gpujob-gateway >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpujob-gateway ||
			die "could not create the user gpujob-gateway (the gateways' user with ACLs)"
	else
		echo "dev-up: warning: no user gpujob-gateway: with ACLs, the gateways run as it; create it as root:" \
			"useradd --system --no-create-home --shell /usr/sbin/nologin gpujob-gateway" >&2
	fi
fi
for ((i = 1; i <= consul_servers; i++)); do mkdir -p "$dir/consul/server-$i"; done
((consul_servers == 1)) || mkdir -p "$dir/consul/client"
for p in "${plugins[@]}"; do ln -sfn "$plugin_src/$p" "$dir/plugins/$p"; done
: >"$dir/cgroup-parents"

# dockerd (GPUJOB_DEV_DOCKER=1): its socket, exec-root (containerd's state and
# sockets), PID file and config file (empty: the host's
# /etc/docker/daemon.json stays out of it) in docker/, its log in logs/; the
# data-root in the agent cache. Its containers get a cgroup parent of their
# own (cgroups v1; dev-down removes it with the clients').
docker_dir=$dir/docker
docker_sock=$docker_dir/docker.sock
docker_cgroup=""
if ((docker)); then
	# containerd's sockets, the longest paths under the exec-root, must fit
	# in a unix socket address (107 bytes).
	long=$docker_dir/exec/containerd/containerd.sock.ttrpc
	((${#long} <= 107)) ||
		die "GPUJOB_DEV_DIR is too long for GPUJOB_DEV_DOCKER=1: $long must fit in a unix socket path (107 bytes)"
	mkdir -p "$docker_dir/exec"
	# Nomad's docker driver runs a task whose GPU reservation sets
	# NVIDIA_VISIBLE_DEVICES (as gpujob's device plugin does, like
	# HashiCorp's nvidia plugin) under the runtime named "nvidia", and
	# refuses the task where dockerd has none. On NVIDIA hosts that is the
	# NVIDIA Container Runtime when installed; with fake GPUs it is plain
	# runc under that name, the device nodes coming from the reservation.
	nvidia_runtime=""
	if [ "$backend" = fake ]; then
		nvidia_runtime=runc
	elif command -v nvidia-container-runtime >/dev/null; then
		nvidia_runtime=$(command -v nvidia-container-runtime)
	fi
	if [ -n "$nvidia_runtime" ]; then
		printf '{"runtimes": {"nvidia": {"path": "%s"}}}\n' "$nvidia_runtime" >"$docker_dir/daemon.json"
	else
		echo '{}' >"$docker_dir/daemon.json"
	fi
	echo "$docker_root" >"$docker_dir/data-root"
	if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
		docker_cgroup=/gpujob-dev-$tag-docker
		echo "$docker_cgroup" >>"$dir/cgroup-parents"
	fi
fi

# ---- TLS: a CA and certificates for this cluster (GPUJOB_DEV_TLS=1) --------------

# Two CAs, Consul's (consul tls ca create) and Nomad's (nomad tls ca
# create), as in production: a certificate made for one is worth nothing to
# the other. Names and addresses are what each side verifies:
# server.dc1.consul / server.global.nomad / client.global.nomad (RPC, with
# verify_server_hostname) and localhost, 127.0.0.1 and the agent's own
# loopback address (HTTPS). The -cli certificates are what API callers (the
# gpujob CLI, the driver, Nomad's Consul client, these scripts) present.
tls_dir=$dir/tls
consul_ca=$tls_dir/consul-ca.pem
nomad_ca=$tls_dir/nomad-ca.pem
consul_cli_cert=$tls_dir/consul-cli.pem
consul_cli_key=$tls_dir/consul-cli-key.pem
nomad_cli_cert=$tls_dir/nomad-cli.pem
nomad_cli_key=$tls_dir/nomad-cli-key.pem
make_certs() {
	local i ips=()
	rm -rf "$tls_dir"
	mkdir -m 700 "$tls_dir"
	(
		cd "$tls_dir"
		# 30 days: long enough for any dev session, short enough that a
		# forgotten state dir holds nothing that stays valid for long.
		"$consul" tls ca create -days 30 >/dev/null
		mv consul-agent-ca.pem consul-ca.pem
		mv consul-agent-ca-key.pem consul-ca-key.pem
		local sign=(-days 30 -ca consul-ca.pem -key consul-ca-key.pem)
		for ((i = 1; i <= consul_servers; i++)); do
			"$consul" tls cert create -server -dc dc1 "${sign[@]}" \
				-additional-ipaddress "$(consul_server_ip "$i")" >/dev/null 2>&1
			mv dc1-server-consul-0.pem "consul-server-$i.pem"
			mv dc1-server-consul-0-key.pem "consul-server-$i-key.pem"
		done
		"$consul" tls cert create -client -dc dc1 "${sign[@]}" >/dev/null
		mv dc1-client-consul-0.pem consul-client.pem
		mv dc1-client-consul-0-key.pem consul-client-key.pem
		"$consul" tls cert create -cli -dc dc1 "${sign[@]}" >/dev/null
		mv dc1-cli-consul-0.pem consul-cli.pem
		mv dc1-cli-consul-0-key.pem consul-cli-key.pem

		"$nomad" tls ca create -days 30 >/dev/null
		mv nomad-agent-ca.pem nomad-ca.pem
		mv nomad-agent-ca-key.pem nomad-ca-key.pem
		sign=(-days 30 -ca nomad-ca.pem -key nomad-ca-key.pem)
		"$nomad" tls cert create -server -region global "${sign[@]}" >/dev/null 2>&1
		mv global-server-nomad.pem nomad-server.pem
		mv global-server-nomad-key.pem nomad-server-key.pem
		for ((i = 1; i <= clients; i++)); do ips+=(-additional-ipaddress "$(client_ip "$i")"); done
		"$nomad" tls cert create -client "${sign[@]}" "${ips[@]}" >/dev/null
		mv global-client-nomad.pem nomad-client.pem
		mv global-client-nomad-key.pem nomad-client-key.pem
		"$nomad" tls cert create -cli "${sign[@]}" >/dev/null
		mv global-cli-nomad.pem nomad-cli.pem
		mv global-cli-nomad-key.pem nomad-cli-key.pem
		# Keys for the agents and the CLI user (root here) alone.
		chmod 600 ./*-key.pem
	) || die "creating the cluster's TLS certificates in $tls_dir failed"
}

# ---- ACL: tokens for this cluster (GPUJOB_DEV_ACL=1) ------------------------------

# Every secret is made here, before any agent starts, so the agents' configs
# can name theirs; Consul and Nomad then create the tokens with exactly
# these secrets once they have a leader. secrets/ holds them (mode 700), one
# file per token, and X-*-Token header files for curl -H @file: a secret
# never appears on a command line, where every user of the machine could
# read it in ps.
secrets=$dir/secrets
new_secret() { cat /proc/sys/kernel/random/uuid; }
# secret NAME VALUE writes secrets/NAME.token and its header file.
save_secret() {
	local header=X-Consul-Token
	[[ $1 != nomad-* ]] || header=X-Nomad-Token
	(umask 077 && printf '%s\n' "$2" >"$secrets/$1.token" && printf '%s: %s\n' "$header" "$2" >"$secrets/$1.header")
}
token_of() { cat "$secrets/$1.token"; }
if ((acl)); then
	mkdir -m 700 "$secrets"
	consul_mgmt=$(new_secret)
	save_secret consul-management "$consul_mgmt"
	# Each Consul agent's own token (node identity: write its node, read
	# services); the Nomad agents' Consul token; the task driver's.
	for ((i = 1; i <= consul_servers; i++)); do save_secret "consul-agent-server-$i" "$(new_secret)"; done
	((consul_servers == 1)) || save_secret consul-agent-client "$(new_secret)"
	save_secret consul-nomad "$(new_secret)"
	save_secret consul-driver "$(new_secret)"
	# A gpujob user's Consul tokens for the sweeps and the services of the
	# namespace "default" (status, best, stop; deploy, tokens).
	save_secret consul-sweeps "$(new_secret)"
	save_secret consul-services "$(new_secret)"
	save_secret consul-gateway "$(new_secret)"
	# The exporters' (read the sweeps).
	save_secret consul-exporter "$(new_secret)"
	# The queues: who applies queue files (write the configuration), a
	# user's (queue jobs of the namespace "default", read the
	# configuration), the admission controller's.
	save_secret consul-queues "$(new_secret)"
	save_secret consul-queue-user "$(new_secret)"
	save_secret consul-queue-controller "$(new_secret)"
	# Nomad's bootstrap token; the submit and read-only tokens are made by
	# Nomad (scripts/dev-acl.py saves them).
	save_secret nomad-management "$(new_secret)"
	# The rendered configs hold agent tokens.
	chmod 700 "$dir/config"
	# The policies: gpujob renders them (those of a namespace's users for
	# the namespace "default"), dev-acl.py applies what it rendered.
	[ -x "$dir/bin/gpujob" ] || die "GPUJOB_DEV_ACL=1 needs $plugin_src/gpujob (make build): it renders the ACL policies (gpujob acl policy)"
	mkdir -p "$dir/acl"
	for policy in $("$dir/bin/gpujob" acl policy | awk 'NR > 1 { print $1 }'); do
		"$dir/bin/gpujob" acl policy "$policy" --namespace default >"$dir/acl/$policy.hcl" ||
			die "gpujob acl policy $policy failed"
	done
	# The users' read of the queue configuration.
	"$dir/bin/gpujob" acl policy consul-queues --read-only >"$dir/acl/consul-queues-read.hcl" ||
		die "gpujob acl policy consul-queues --read-only failed"
fi
if ((tls)); then make_certs; fi

# What curl needs to talk to each API here: the CA and a client certificate
# with TLS, the management token's header with ACLs. Nomad's and Consul's
# /v1/status/leader answer without a token.
nomad_tls_curl=() consul_tls_curl=()
if ((tls)); then
	nomad_tls_curl=(--cacert "$nomad_ca" --cert "$nomad_cli_cert" --key "$nomad_cli_key")
	consul_tls_curl=(--cacert "$consul_ca" --cert "$consul_cli_cert" --key "$consul_cli_key")
fi
nomad_curl=("${nomad_tls_curl[@]}") consul_curl=("${consul_tls_curl[@]}")
if ((acl)); then
	nomad_curl+=(-H "@$secrets/nomad-management.header")
	consul_curl+=(-H "@$secrets/consul-management.header")
fi

# consul_security_config server N | client renders an agent's TLS and ACL
# settings.
consul_security_config() {
	local kind=$1 n=${2:-} cert=consul-client token=consul-agent-client management=""
	if [ "$kind" = server ]; then cert=consul-server-$n token=consul-agent-server-$n; fi
	if ((tls)); then
		cat <<EOF
# HTTPS only (ports.http is off) and mutual TLS: every agent and every API
# caller shows a certificate signed by the cluster's CA, and an agent
# accepts RPC only from a server.dc1.consul.
tls {
  defaults {
    ca_file         = "$consul_ca"
    cert_file       = "$tls_dir/$cert.pem"
    key_file        = "$tls_dir/$cert-key.pem"
    verify_incoming = true
    verify_outgoing = true
  }
  internal_rpc {
    verify_server_hostname = true
  }
}
EOF
	fi
	if ((acl)); then
		if [ "$kind" = server ]; then
			management=$'\n'"    initial_management = \"$(token_of consul-management)\""
		fi
		cat <<EOF
# Default deny: a request without a token may do nothing. The first leader
# creates the management token; the agent token (a node identity: write
# this node, read services) keeps the agent's own catalog entry current.
acl {
  enabled        = true
  default_policy = "deny"
  down_policy    = "extend-cache"
  tokens {$management
    agent = "$(token_of "$token")"
  }
}
EOF
	fi
}

# consul_http_ports: with TLS the HTTP API moves to HTTPS on the same port
# number. consul_grpc_port: the plaintext gRPC port is off with TLS.
consul_http_ports() {
	if ((tls)); then
		printf '  http     = -1\n  https    = %s\n' "$consul_http"
	else
		printf '  http     = %s\n' "$consul_http"
	fi
}
consul_grpc_port() {
	if ((tls)); then echo -1; else echo "$consul_grpc"; fi
}

# nomad_security_config server|client renders a Nomad agent's TLS and ACL
# settings, and its consul block.
nomad_security_config() {
	local kind=$1
	if ((tls)); then
		cat <<EOF
# HTTPS and RPC over mutual TLS: RPC only between server.global.nomad and
# client.global.nomad certificates, and every HTTPS caller must show one
# signed by the cluster's CA.
tls {
  http                   = true
  rpc                    = true
  ca_file                = "$nomad_ca"
  cert_file              = "$tls_dir/nomad-$kind.pem"
  key_file               = "$tls_dir/nomad-$kind-key.pem"
  verify_server_hostname = true
  verify_https_client    = true
}
EOF
	fi
	if ((acl)); then
		if [ "$kind" = server ]; then
			# A token may live as briefly as a second: the e2e tests
			# watch one expire (Nomad's floor is otherwise 1m).
			printf 'acl {\n  enabled                  = true\n  token_min_expiration_ttl = "1s"\n}\n'
		else
			printf 'acl {\n  enabled = true\n}\n'
		fi
	fi
	echo "consul {"
	echo "  address = \"$consul_addr\""
	if ((tls)); then
		cat <<EOF
  ssl        = true
  verify_ssl = true
  ca_file    = "$consul_ca"
  cert_file  = "$consul_cli_cert"
  key_file   = "$consul_cli_key"
EOF
	fi
	if ((acl)); then
		echo "  # the policy of jobspecs/acl/consul-nomad-agent.hcl"
		echo "  token = \"$(token_of consul-nomad)\""
	fi
	echo "}"
}

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
$(consul_http_ports)
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
$(consul_http_ports)
  dns      = $consul_dns
  grpc     = $(consul_grpc_port)
  grpc_tls = $consul_grpc_tls
  server   = $consul_server
  serf_lan = $consul_serf_lan
  serf_wan = $consul_serf_wan
}
EOF
	fi
	consul_security_config server "$n"
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
$(consul_http_ports)
  dns      = $consul_dns
  grpc     = $(consul_grpc_port)
  grpc_tls = $consul_grpc_tls
  serf_lan = $consul_serf_lan
  serf_wan = -1
}
EOF
	consul_security_config client
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
${GPUJOB_DEV_NOMAD_SERVER_EXTRA:-}
}
client {
  enabled = false
}
$(nomad_security_config server)
EOF

# The task driver's Consul token (the policy of
# jobspecs/acl/consul-gpujob-driver.hcl) and TLS files. The driver hands
# them to each task's supervisor in a file of the task's private directory,
# never in the ranks' environment.
driver_consul_extra=""
denylist="docker,qemu,java"
((docker == 0)) || denylist="qemu,java"
if ((acl)); then
	driver_consul_extra+=$'\n'"      token     = \"$(token_of consul-driver)\""
fi
if ((tls)); then
	driver_consul_extra+=$'\n'"      ca_file   = \"$consul_ca\""
	driver_consul_extra+=$'\n'"      cert_file = \"$consul_cli_cert\""
	driver_consul_extra+=$'\n'"      key_file  = \"$consul_cli_key\""
fi

for ((i = 1; i <= clients; i++)); do
	ip=$(client_ip "$i")
	cg=$(cgroup_parent "$i")
	echo "$cg" >>"$dir/cgroup-parents"
	# Made here, traversable: the client would create data_dir 0700 (as
	# the parent of its 0700 state dir), shutting the tasks' users out of
	# their task directories. Nomad makes data_dir/alloc 0711 itself.
	mkdir -p "$dir/client-$i/data"
	chmod 0755 "$dir/client-$i"
	chmod 0711 "$dir/client-$i/data"
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
  min_dynamic_port  = $((dyn_ports + (i - 1) * dyn_per_client))
  max_dynamic_port  = $((dyn_ports + i * dyn_per_client - 1))
  cgroup_parent     = "$cg"$([ -z "$cpu_mhz" ] || printf '\n  cpu_total_compute = %s' "$cpu_mhz")
  options {
    "driver.denylist" = "$denylist"
  }
}
$(nomad_security_config client)
plugin "raw_exec" {
  config {
    enabled = true
  }
}
EOF
		if ((docker)); then
			# Every client shares the one dockerd, so no client may take
			# the others' containers for dangling ones (the reconciler
			# removes any Nomad container it does not track itself);
			# dev-down removes what is left. Images stay (gc.image): they
			# are built here, there is no registry to pull them again.
			# Host networking only: no bridge, so no pause container
			# (infra_image) is ever needed.
			cat <<EOF
plugin "docker" {
  config {
    endpoint         = "unix://$docker_sock"
    allow_privileged = false
    extra_labels     = ["job_name", "task_group_name", "task_name", "node_name"]
    volumes {
      enabled = true
    }
    gc {
      image     = false
      container = true
      dangling_containers {
        enabled = false
      }
    }
  }
}
EOF
		fi
		if have_plugin nomad-device-gpujob; then
			if [ "$backend" = nvml ] && [ ${#gpu_uuids[@]} -gt 0 ]; then
				ignored=$(ignored_gpus "$i")
			else
				ignored="[]"
			fi
			dev_root=$(fake_gpu_nodes "$i")
			mkdir -p "$dir/fake-gpus" # control files (nvml.FakeControl), written by tests
			[ -z "$dev_root" ] || dev_root="      dev_root   = \"$dev_root\""
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
$dev_root
      control_file = "$dir/fake-gpus/$(client_name "$i").json"
    }
  }
}
EOF
		fi
		if have_plugin nomad-driver-gpujob; then
			# Checkpoints on the machine's own disk stand in for the shared
			# storage a real cluster mounts on every client.
			# container_supervisor: the static supervisor the driver copies
			# into container members (make build: bin/gpujob-supervisor).
			# host_env: the driver's default and the machine's OpenBLAS
			# settings (some machines set OPENBLAS_CORETYPE to keep older
			# OpenBLAS builds correct): host and container ranks alike then
			# compute with the kernels the machine chose.
			driver_config=${GPUJOB_DEV_DRIVER_CONFIG:-"    checkpoint_root = \"$dir/checkpoints\"
    container_supervisor = \"$supervisor_bin\"
    host_env = [\"PATH\", \"LANG\", \"LANGUAGE\", \"LC_*\", \"TZ\", \"OPENBLAS_*\"]
    consul {
      address = \"$consul_addr\"$driver_consul_extra
    }"}
			cat <<EOF
plugin "nomad-driver-gpujob" {
  config {
$driver_config
${GPUJOB_DEV_DRIVER_EXTRA:-}
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
	gpujob_dev_start "$dir" "$nomad_addr" "$consul_env_addr" "$@"
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
	body=$(curl -fsS --max-time 3 "${nomad_curl[@]}" "$nomad_addr/v1/nodes" 2>/dev/null) || return 1
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
# dockerd first: it starts while Consul elects a leader, and must answer
# before the clients fingerprint their docker driver. No bridge, no iptables
# rules, no ip_forward: the host's network is left as it was (tasks use
# network_mode host).
if ((docker)); then
	dockerd_args=(--data-root "$docker_root" --exec-root "$docker_dir/exec" --host "unix://$docker_sock"
		--pidfile "$docker_dir/dockerd.pid" --config-file "$docker_dir/daemon.json"
		--storage-driver "${GPUJOB_DEV_DOCKER_STORAGE_DRIVER:-overlay2}"
		--bridge none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --userland-proxy=false
		--log-level warn)
	[ -z "$docker_cgroup" ] || dockerd_args+=(--cgroup-parent "$docker_cgroup")
	start dockerd "$docker_dir" "$dockerd_bin" "${dockerd_args[@]}"
fi
for ((i = 1; i <= consul_servers; i++)); do
	start "consul-server-$i" "$dir/consul/server-$i" "$consul" agent -config-file "$dir/config/consul-server-$i.hcl"
done
consul_http_agent="consul-server-1"
if ((consul_servers > 1)); then
	start consul-client "$dir/consul/client" "$consul" agent -config-file "$dir/config/consul-client.hcl"
	consul_http_agent="consul-client"
fi
wait_for "a Consul leader" "$consul_http_agent" gpujob_has_leader "$consul_url" "${consul_tls_curl[@]}"
if ((acl)); then
	log "bootstrapping Consul's ACLs"
	consul_nodes=()
	for ((i = 1; i <= consul_servers; i++)); do
		if ((consul_servers == 1)); then consul_nodes+=(gpujob-dev); else consul_nodes+=("gpujob-dev-consul-$i"); fi
	done
	((consul_servers == 1)) || consul_nodes+=(gpujob-dev)
	GPUJOB_DEV_ACL_TIMEOUT=$((deadline - SECONDS)) "$py" "$here/dev-acl.py" consul "$dir" "$consul_url" "$dir/acl" "${consul_nodes[@]}" ||
		fail "$consul_http_agent" "bootstrapping Consul's ACLs failed"
fi
wait_for "Consul's node gpujob-dev to be healthy" "$consul_http_agent" gpujob_consul_node_healthy "$consul_url" gpujob-dev "${consul_curl[@]}"

if ((docker)); then
	docker_up() { "$docker_cli" -H "unix://$docker_sock" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
	wait_for "dockerd to answer on $docker_sock" dockerd docker_up
	# The data-root is this cluster's alone now: a container in it is one
	# an earlier cluster's dockerd left when it was killed.
	mapfile -t stale < <("$docker_cli" -H "unix://$docker_sock" ps -aq 2>/dev/null || true)
	if [ ${#stale[@]} -gt 0 ]; then
		log "removing ${#stale[@]} container(s) an earlier dev cluster's dockerd left in $docker_root"
		"$docker_cli" -H "unix://$docker_sock" rm -f "${stale[@]}" >/dev/null 2>&1 || true
	fi
fi

start nomad-server "$dir/server" "$nomad" agent -config "$dir/config/nomad-server.hcl"
# The clients retry the server until it answers, so they start right away.
for ((i = 1; i <= clients; i++)); do
	start "nomad-client-$i" "$dir/client-$i" "$nomad" agent -config "$dir/config/nomad-client-$i.hcl"
done
drivers=raw_exec
have_plugin nomad-driver-gpujob && drivers+=" gpujob"
((docker == 0)) || drivers+=" docker"
wait_for "a Nomad leader" nomad-server gpujob_has_leader "$nomad_addr" "${nomad_tls_curl[@]}"
if ((acl)); then
	log "bootstrapping Nomad's ACLs"
	GPUJOB_DEV_ACL_TIMEOUT=$((deadline - SECONDS)) "$py" "$here/dev-acl.py" nomad "$dir" "$nomad_addr" "$dir/acl" ||
		fail nomad-server "bootstrapping Nomad's ACLs failed"
fi
wait_for "$clients ready Nomad client(s)" @lagging clients_ready

# ---- the gpujob gateway -----------------------------------------------------------

# gateway_env is the environment the gateway job is rendered and run with:
# the cluster's addresses; with ACLs or TLS the management token and the
# CLI's certificates to register it (the gateways themselves read theirs
# from the variable nomad/jobs/gpujob-gateway).
gateway_env() {
	local e=(NOMAD_ADDR="$nomad_addr" CONSUL_HTTP_ADDR="$consul_env_addr")
	if ((tls)); then
		e+=(NOMAD_CACERT="$nomad_ca" NOMAD_CLIENT_CERT="$nomad_cli_cert" NOMAD_CLIENT_KEY="$nomad_cli_key")
	fi
	((acl == 0)) || e+=(NOMAD_TOKEN="$(token_of nomad-management)")
	printf '%s\n' "${e[@]}"
}
gateway_healthy() { curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$gateway_port/-/healthz" 2>/dev/null; }
if ((gateway)) && [ -x "$dir/bin/gpujob" ]; then
	log "starting the gpujob gateway on 127.0.0.1:$gateway_port"
	render_args=(gateway render --binary "$dir/bin/gpujob" --port "$gateway_port")
	if ((acl || tls)); then
		render_args+=(--secrets)
		GPUJOB_DEV_ACL_TIMEOUT=$((deadline - SECONDS)) "$py" "$here/dev-acl.py" gateway "$dir" "$nomad_addr" "$acl" "$tls" ||
			fail nomad-server "writing the gateway's variable failed"
	fi
	mapfile -t genv < <(gateway_env)
	env "${genv[@]}" "$dir/bin/gpujob" "${render_args[@]}" >"$dir/config/gateway.nomad.hcl" ||
		die "gpujob gateway render failed"
	env "${genv[@]}" "$nomad" job run -detach "$dir/config/gateway.nomad.hcl" >"$dir/logs/gateway-register.log" 2>&1 ||
		fail nomad-server "registering the gateway job failed: $(cat "$dir/logs/gateway-register.log")"
	wait_for "the gpujob gateway on port $gateway_port" nomad-client-1 gateway_healthy
fi

# ---- the gpujob exporter ----------------------------------------------------------

# One exporter per client (a system job). They need only read access to
# Nomad and Consul: with ACLs or TLS, read-only tokens of their own and the
# CLI's Consul certificate, which they read from the variable
# nomad/jobs/gpujob-exporter with their workload identity (--secrets).
exporters_healthy() {
	local n
	n=$(curl -fsS --max-time 2 "${consul_curl[@]}" "$consul_url/v1/health/service/gpujob-exporter?passing" 2>/dev/null |
		"$py" -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null) || return 1
	[ "$n" = "$clients" ]
}
if ((exporter)) && [ -x "$dir/bin/gpujob" ]; then
	# One client: DCGM's port (plus the offset); several share 127.0.0.1,
	# so Nomad picks each one's port and Prometheus finds them in Consul.
	eport=$exporter_port
	((clients == 1)) || eport=0
	log "starting the gpujob exporter (port ${eport/#0/dynamic})"
	exporter_args=(exporter render --binary "$dir/bin/gpujob" --port "$eport")
	# Registering it takes what registering the gateway takes (gateway_env).
	exporter_env=(NOMAD_ADDR="$nomad_addr" CONSUL_HTTP_ADDR="$consul_env_addr")
	if ((tls)); then
		exporter_env+=(NOMAD_CACERT="$nomad_ca" NOMAD_CLIENT_CERT="$nomad_cli_cert" NOMAD_CLIENT_KEY="$nomad_cli_key")
	fi
	((acl == 0)) || exporter_env+=(NOMAD_TOKEN="$(token_of nomad-management)")
	if ((acl || tls)); then
		exporter_args+=(--secrets)
		GPUJOB_DEV_ACL_TIMEOUT=$((deadline - SECONDS)) "$py" "$here/dev-acl.py" exporter "$dir" "$nomad_addr" "$acl" "$tls" ||
			fail nomad-server "writing the exporter's variable failed"
	fi
	env "${exporter_env[@]}" "$dir/bin/gpujob" "${exporter_args[@]}" >"$dir/config/exporter.nomad.hcl" ||
		die "gpujob exporter render failed"
	env "${exporter_env[@]}" "$nomad" job run -detach "$dir/config/exporter.nomad.hcl" >"$dir/logs/exporter-register.log" 2>&1 ||
		fail nomad-server "registering the exporter job failed: $(cat "$dir/logs/exporter-register.log")"
	wait_for "the gpujob exporters in Consul" nomad-client-1 exporters_healthy
fi
# ---- the queue's admission controller ----------------------------------------------
# `gpujob queue apply` starts it (a Nomad job); with ACLs or TLS it reads its
# tokens and Consul's TLS material from the variable
# nomad/jobs/gpujob-queue-controller, which an operator writes once: here.
if ((acl || tls)) && [ -x "$dir/bin/gpujob" ]; then
	GPUJOB_DEV_ACL_TIMEOUT=$((deadline - SECONDS)) "$py" "$here/dev-acl.py" queue-controller "$dir" "$nomad_addr" "$acl" "$tls" ||
		fail nomad-server "writing the queue controller's variable failed"
fi
startup=$((SECONDS - t0))

# ---- report -----------------------------------------------------------------------

# The driver's checkpoint_root (GPUJOB_DEV_DRIVER_CONFIG may name another).
checkpoint_root=$dir/checkpoints
if [[ ${GPUJOB_DEV_DRIVER_CONFIG:-} =~ checkpoint_root[[:space:]]*=[[:space:]]*\"([^\"]*)\" ]]; then
	checkpoint_root=${BASH_REMATCH[1]}
fi

# With ACLs the env file holds a token: readable by its owner alone.
env_umask=022
((acl == 0)) || env_umask=077
(
	umask "$env_umask"
	exec >"$dir/env.tmp"
	cat <<EOF
# Source this file to use the gpujob dev cluster started by scripts/dev-up.sh.
export GPUJOB_DEV_DIR='$dir'
export GPUJOB_DEV_WORKLOADS='$dir/workloads'
export NOMAD_ADDR='$nomad_addr'
export CONSUL_HTTP_ADDR='$consul_env_addr'
export PATH='$(dirname "$nomad")':'$(dirname "$consul")':"\$PATH"
export GPUJOB_DEV_CONSUL_SERVERS='$consul_servers'
export GPUJOB_DEV_NOMAD_BIN='$nomad'
export GPUJOB_DEV_CONSUL_BIN='$consul'
export GPUJOB_DEV_ACL='$acl'
export GPUJOB_DEV_TLS='$tls'
export GPUJOB_DEV_DOCKER='$docker'
export GPUJOB_CHECKPOINT_ROOT='$checkpoint_root'
export GPUJOB_CONTROLLER_BINARY='$dir/bin/gpujob'
export GPUJOB_FAKE_GPU_DIR='$dir/fake-gpus'
EOF
	if ((exporter)) && ((clients == 1)); then
		echo "export GPUJOB_EXPORTER_ADDR='http://127.0.0.1:$exporter_port'"
	fi
	if ((gateway)); then
		echo "export GPUJOB_GATEWAY_ADDR='http://127.0.0.1:$gateway_port'"
		echo "export GPUJOB_GATEWAY_ADMIN_ADDR='http://127.0.0.1:$((gateway_port + 1))'"
	fi
	if ((docker)); then
		cat <<EOF
# Docker: the cluster's own dockerd (the clients' docker driver uses it).
# Use Debian's client, GPUJOB_DOCKER_CLI: another one may come first on PATH.
export DOCKER_HOST='unix://$docker_sock'
export GPUJOB_DOCKER_CLI='$docker_cli'
export GPUJOB_DEV_DOCKER_ROOT='$docker_root'
EOF
	fi
	if ((tls)); then
		cat <<EOF
# TLS: the cluster's CAs, and the client certificates the APIs ask for.
export NOMAD_CACERT='$nomad_ca'
export NOMAD_CLIENT_CERT='$nomad_cli_cert'
export NOMAD_CLIENT_KEY='$nomad_cli_key'
export CONSUL_CACERT='$consul_ca'
export CONSUL_CLIENT_CERT='$consul_cli_cert'
export CONSUL_CLIENT_KEY='$consul_cli_key'
EOF
	fi
	if ((acl)); then
		cat <<EOF
# ACLs: a gpujob user's token (jobspecs/acl/nomad-submit.hcl). The others
# are in $secrets (NAME.token): nomad-readonly, nomad-management,
# consul-management, ... The consul CLI has none by default; for example
#   CONSUL_HTTP_TOKEN_FILE=$secrets/consul-management.token consul members
# Queues: CONSUL_HTTP_TOKEN_FILE=$secrets/consul-queues.token for gpujob queue
# apply, consul-queue-user.token to submit into the queues.
export NOMAD_TOKEN='$(token_of nomad-submit)'
export GPUJOB_DEV_SECRETS='$secrets'
EOF
	fi
)
mv "$dir/env.tmp" "$dir/env"

# One line per client: address, drivers, GPUs.
nodes=$(curl -fsS --max-time 5 "${nomad_curl[@]}" "$nomad_addr/v1/nodes?resources=true" | "$py" -c '
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
security="no ACLs, no TLS"
if ((acl && tls)); then
	security="ACLs (default deny) and mutual TLS"
elif ((acl)); then
	security="ACLs (default deny), no TLS"
elif ((tls)); then
	security="mutual TLS, no ACLs"
fi
cat <<EOF
gpujob dev cluster is up in ${startup}s: $clients client(s), $consul_servers Consul server(s); $devices
  Nomad   $nomad_addr  (UI: $nomad_addr/ui)
  Consul  $consul_url  (UI: $consul_url/ui)
  security: $security
EOF
if ((gateway)); then
	echo "  Gateway http://127.0.0.1:$gateway_port  (gpujob service deploy; /metrics and /-/stats at http://127.0.0.1:$((gateway_port + 1)))"
fi
if ((docker)); then
	echo "  Docker  unix://$docker_sock  (dockerd $("$docker_cli" -H "unix://$docker_sock" version --format '{{.Server.Version}}' 2>/dev/null), data-root $docker_root)"
fi
if ((tls)); then
	echo "  TLS:    CAs and client certificates in $tls_dir (the UIs ask for a client certificate too)"
fi
if ((acl)); then
	echo "  tokens: $secrets (NOMAD_TOKEN in the env file: the gpujob-submit policy)"
fi
cat <<EOF
  nodes:
$nodes
  state:  $dir  (logs in $dir/logs)
  use it: source $dir/env
  stop:   $down
EOF
