# Consul client agent for a local gpujob dev cluster with several Consul
# servers (GPUJOB_DEV_CONSUL_SERVERS=3), run as
#
#   consul agent -config-file jobspecs/agent/consul-client.hcl
#
# As on every node of a production cluster, the Nomad agents and the gpujob
# supervisors talk to this local agent, never to a server: the sessions the
# supervisors create are bound to this agent's node (and its serfHealth
# check), so they survive the loss of any one server, the leader included.
# scripts/dev-up.sh renders it with the ports it was given.

node_name            = "gpujob-dev"
datacenter           = "dc1"
data_dir             = "/tmp/gpujob-dev/consul/client/data"
log_level            = "INFO"
disable_update_check = true

server = false

# A client agent leaves the cluster on SIGTERM by default, and leaving
# invalidates every session bound to its node: restarting the local agent (an
# upgrade) would cost every supervisor on the node its session. Keep the node
# registered across a restart.
leave_on_terminate = false

# The servers' gossip addresses; retried every second until one answers.
retry_join     = ["127.0.1.1:8301", "127.0.1.2:8301", "127.0.1.3:8301"]
retry_interval = "1s"

# Loopback only (see consul-server.hcl), on the address and ports a
# single-server cluster serves its API on, so CONSUL_HTTP_ADDR is the same
# either way.
bind_addr   = "127.0.0.1"
client_addr = "127.0.0.1"

# Every agent and supervisor of a dev cluster on one machine connects from 127.0.0.1,
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
  http     = 8500
  dns      = 8600
  grpc     = 8502
  grpc_tls = 8503
  serf_lan = 8301
  serf_wan = -1 # servers only
}
