# Nomad policy of the gpujob gateways' token: the elected gateway reads a
# service's job and scales its replica group within the spec's bounds.
#
#   nomad acl policy apply -description "gpujob gateways" gpujob-gateway jobspecs/acl/nomad-gpujob-gateway.hcl
#   nomad acl token create -name gpujob-gateway -policy gpujob-gateway
#
# The token reaches the gateways through the Nomad variable
# nomad/jobs/gpujob-gateway (gpujob gateway render --secrets).
# scripts/dev-up.sh does all this with GPUJOB_DEV_ACL=1. List each namespace
# that runs services instead of "*" to narrow it.
namespace "*" {
  capabilities = ["read-job", "scale-job"]
}
