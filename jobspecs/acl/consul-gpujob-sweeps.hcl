# Consul policy of a gpujob user's Consul token for sweeps (CONSUL_HTTP_TOKEN),
# for ONE Nomad namespace: gpujob sweep status, best and report read the
# namespace's sweeps' records, and gpujob sweep stop (without --purge) and
# extend write their state and their trials' stop requests. Submitting and
# purging a sweep on a cluster with ACLs also creates and deletes its
# controller's own token and policy, which takes a token with acl = "write"
# (see docs/guides/sweeps.md).
#
# The file is a template (Go text/template; its blanks are the namespace, the
# key prefix and the access): render it for a namespace with gpujob, then
# apply what it prints:
#
#   gpujob acl policy consul-sweeps --namespace team-a > sweeps-team-a.hcl
#   consul acl policy create -name gpujob-sweeps-team-a -rules @sweeps-team-a.hcl
#   consul acl token create -policy-name gpujob-sweeps-team-a -description "alice: gpujob sweeps in team-a"
#
# (--read-only renders "read" for a user who only looks: status, best,
# report.) scripts/dev-up.sh renders it for the namespace "default" with
# GPUJOB_DEV_ACL=1 (make dev ACL=1) and saves such a token as
# secrets/consul-sweeps.token.
#
# Why one policy per namespace: a sweep's record holds the trial template
# its controller registers with the controller's own Nomad token. Write on
# every namespace's sweeps would let a user of one namespace rewrite another
# namespace's template, state or stop requests, and so run code there.

# The namespace's sweeps ("gpujob/sweeps" by default: the CLI's
# GPUJOB_SWEEP_KEY_PREFIX and the driver's sweep_key_prefix; gpujob acl
# policy --sweep-prefix). The trailing slash keeps every other namespace out
# of reach, also one whose name starts with this one's ("team" and "team-b").
key_prefix "{{.SweepPrefix}}/{{.Namespace}}/" {
  policy = "{{.Access}}"
}
