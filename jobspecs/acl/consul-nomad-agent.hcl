# Consul policy of the token in the Nomad agents' own consul { token }:
# Nomad's Consul integration, not gpujob's (the task driver has its own,
# consul-gpujob-driver.hcl).
#
#   consul acl policy create -name gpujob-nomad-agent -rules @jobspecs/acl/consul-nomad-agent.hcl
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1 (make dev ACL=1).

# The Nomad client's Consul fingerprint reads the local agent
# (/v1/agent/self) for consul.* node attributes, and the service sync lists
# the agent's services and checks.
agent_prefix "" {
  policy = "read"
}

# Nomad registers each agent in the catalog, with its health checks: the
# servers as the service "nomad", the clients as "nomad-client". Nothing
# gpujob renders declares a service; a job that does needs write on its
# service names too (Nomad registers them with this token unless the job
# brings its own).
service "nomad" {
  policy = "write"
}
service "nomad-client" {
  policy = "write"
}

# The services of jobs (gpujob services' replicas, the gateways): Nomad
# registers them, with their checks, through the local agent.
service_prefix "" {
  policy = "write"
}
