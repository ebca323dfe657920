# Consul server agent for the local gpujob dev cluster, run as
#
#   consul agent -config-file jobspecs/agent/consul-server.hcl
#
# A real server with its state on disk, not `consul agent -dev`: a -dev agent
# keeps everything in memory, so restarting it loses every key and session,
# which no deployment does. scripts/dev-up.sh renders this file with the ports
# it was given (CONSUL_*_PORT, GPUJOB_DEV_PORT_OFFSET), so a second cluster can
# run beside the first. This is the single-server form
# (GPUJOB_DEV_CONSUL_SERVERS=1, the default); see the end of the file for what
# changes with three.

node_name            = "gpujob-dev"
datacenter           = "dc1"
data_dir             = "/tmp/gpujob-dev/consul/server-1/data"
log_level            = "INFO"
disable_update_check = true

server = true
# The number of servers the raft cluster waits for before it elects a
# leader: 1 here; a production cluster runs 3 or 5.
bootstrap_expect = 1

# Loopback only, for gossip/RPC (bind_addr) and for the HTTP, DNS and gRPC
# APIs (client_addr): nothing outside this machine may reach the catalog.
bind_addr   = "127.0.0.1"
client_addr = "127.0.0.1"

# Consul's recommended production raft timing (the default 5 is for small
# cloud VMs): a new leader about a second after the old one is gone.
performance {
  raft_multiplier = 1
}

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
  server   = 8300
  serf_lan = 8301
  serf_wan = 8302
}

# With GPUJOB_DEV_CONSUL_SERVERS=3, server N instead has
#
#   node_name        = "gpujob-dev-consul-N"
#   data_dir         = "/tmp/gpujob-dev/consul/server-N/data"
#   bootstrap_expect = 3
#   bind_addr        = "127.0.1.N"      # clear of the Nomad clients' 127.0.0.(i+1)
#   client_addr      = "127.0.1.N"
#   retry_join       = ["127.0.1.M:8301", ...]   # the other servers
#   retry_interval   = "1s"             # the default 30 s would slow the start
#   autopilot {
#     # Never prune a dead server from the raft peers: a killed server comes
#     # back as the same voter, and the cluster never shrinks to 2 voters that
#     # cannot lose another.
#     min_quorum = 3
#   }
#   ports { dns = -1, grpc = -1, grpc_tls = -1 }  # served by the client agent
#
# and the API is served by a Consul client agent (consul-client.hcl).
#
# With GPUJOB_DEV_TLS=1 the HTTP API moves to HTTPS on the same port
# (ports { http = -1, https = 8500, grpc = -1 }) and every agent has
#
#   tls {
#     defaults {
#       ca_file = ".../consul-ca.pem", cert_file = ".../consul-server-1.pem", key_file = ".../consul-server-1-key.pem"
#       verify_incoming = true, verify_outgoing = true
#     }
#     internal_rpc { verify_server_hostname = true }
#   }
#
# With GPUJOB_DEV_ACL=1:
#
#   acl {
#     enabled        = true
#     default_policy = "deny"
#     down_policy    = "extend-cache"
#     tokens {
#       initial_management = "<secret>"  # servers only; the first leader creates it
#       agent              = "<secret>"  # a node identity for this agent's node name
#     }
#   }
