# Consul policy of a gpujob user's Consul token for sweeps (CONSUL_HTTP_TOKEN):
# gpujob sweep status, best and report read a sweep's records, and
# gpujob sweep stop (without --purge) and extend write its state and its
# trials' stop requests. Submitting and purging a sweep on a cluster with
# ACLs also creates and deletes its controller's own token and policy, which
# takes a token with acl = "write" (see the README's Sweeps section).
#
#   consul acl policy create -name gpujob-sweeps -rules @jobspecs/acl/consul-gpujob-sweeps.hcl
#   consul acl token create -policy-name gpujob-sweeps -description "alice: gpujob sweeps"
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1 (make dev ACL=1) and
# saves such a token as secrets/consul-sweeps.token.

# The sweeps' tree ("gpujob/sweeps" by default: the CLI's
# GPUJOB_SWEEP_KEY_PREFIX and the driver's sweep_key_prefix). Use "read" for
# a user who only looks: status, best and report.
key_prefix "gpujob/sweeps/" {
  policy = "write"
}
