# Nomad server agent for a single-machine gpujob cluster.
#
# This is the file scripts/dev-up.sh renders into $GPUJOB_DEV_DIR/config/ with
# its default settings (GPUJOB_DEV_DIR=/tmp/gpujob-dev, default ports). Use it
# as a starting point for a real server: change bind_addr/advertise to an
# internal address and raise bootstrap_expect to the number of servers.
#
#   nomad agent -config jobspecs/agent/nomad-server.hcl

name                 = "gpujob-dev-server"
datacenter           = "dc1"
data_dir             = "/tmp/gpujob-dev/server/data"
log_level            = "INFO"
disable_update_check = true

# Loopback only: the scheduler's HTTP, RPC and gossip ports must never listen
# on a routable address in a dev cluster.
bind_addr = "127.0.0.1"

ports {
  http = 4646
  rpc  = 4647
  serf = 4648
}

# Required outside `-dev` mode: with a loopback bind_addr Nomad refuses to
# guess ("Defaulting advertise to localhost is unsafe").
advertise {
  http = "127.0.0.1:4646"
  rpc  = "127.0.0.1:4647"
  serf = "127.0.0.1:4648"
}

server {
  enabled          = true
  bootstrap_expect = 1
}

# The server runs no tasks; clients are separate agents (nomad-client.hcl).
client {
  enabled = false
}

# Registers the server in Consul (service "nomad") and lets jobs use Consul
# service discovery, which the gpujob driver's rendezvous relies on.
consul {
  address = "127.0.0.1:8500"
}
