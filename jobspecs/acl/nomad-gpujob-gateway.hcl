# Nomad policy of the gpujob gateways' token: every gateway reads each
# routed service's job and its allocations (a Consul instance gets traffic
# only when Nomad says it is a running allocation of the route's job, and
# the job claims the route in its meta), and the elected gateway scales a
# service's replica group within the spec's bounds (only a job that claims
# the route).
#
#   nomad acl policy apply -description "gpujob gateways" gpujob-gateway jobspecs/acl/nomad-gpujob-gateway.hcl
#   nomad acl token create -name gpujob-gateway -policy gpujob-gateway
#
# The token reaches the gateways through the Nomad variable
# nomad/jobs/gpujob-gateway (gpujob gateway render --secrets).
# scripts/dev-up.sh does all this with GPUJOB_DEV_ACL=1. List each namespace
# that runs services instead of "*" to narrow it: a route in a namespace the
# token cannot read serves nothing (its replicas are never admitted).
namespace "*" {
  capabilities = ["read-job", "scale-job"]
}
