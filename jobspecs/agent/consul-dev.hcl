# Consul agent for the local gpujob dev cluster, run as
#
#   consul agent -dev -config-file jobspecs/agent/consul-dev.hcl
#
# `-dev` keeps everything in memory and makes the agent a single server that
# elects itself leader. scripts/dev-up.sh renders this file with the ports it
# was given (CONSUL_*_PORT), so a second cluster can run beside the first.

node_name            = "gpujob-dev"
datacenter           = "dc1"
log_level            = "INFO"
disable_update_check = true

# Loopback only, for gossip/RPC (bind_addr) and for the HTTP, DNS and gRPC
# APIs (client_addr): nothing outside this machine may reach the catalog.
bind_addr   = "127.0.0.1"
client_addr = "127.0.0.1"

ports {
  http     = 8500
  dns      = 8600
  grpc     = 8502
  grpc_tls = 8503
  server   = 8300
  serf_lan = 8301
  serf_wan = 8302
}
