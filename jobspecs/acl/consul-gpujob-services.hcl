# Consul policy of a gpujob user's Consul token for services
# (CONSUL_HTTP_TOKEN), for ONE Nomad namespace: gpujob service deploy and stop
# write the namespace's services' routes, gpujob token create, list and
# revoke their tokens (stored hashed), and gpujob service status reads their
# replicas' health.
#
# The file is a template (Go text/template; its blanks are the namespace, the
# key prefix and the access): render it for a namespace with gpujob, then
# apply what it prints:
#
#   gpujob acl policy consul-services --namespace team-a > services-team-a.hcl
#   consul acl policy create -name gpujob-services-team-a -rules @services-team-a.hcl
#   consul acl token create -policy-name gpujob-services-team-a -description "alice: gpujob services in team-a"
#
# (--read-only: service status only.) scripts/dev-up.sh renders it for the
# namespace "default" with GPUJOB_DEV_ACL=1 (make dev ACL=1) and saves such a
# token as secrets/consul-services.token.
#
# Why one policy per namespace: a route names the Nomad job and group the
# gateways' autoscaler scales and the Consul service whose replicas get the
# traffic. Write on every namespace's routes would let a user of one
# namespace point another namespace's route elsewhere, delete it, or mint
# bearer tokens for another namespace's service.

# Every namespace's routes, read only: a path is routed by every gateway, so
# gpujob service deploy refuses a path another namespace's service holds,
# and must see those routes. Each service's tokens are stored under the
# SHA-256 of their secret (random, 256 bits), so what this shows of them
# (IDs, names, rate limits) lets no one use one.
key_prefix "{{.ServicePrefix}}/" {
  policy = "read"
}

# The namespace's own services ("gpujob/services" by default: the CLI's and
# the gateways' GPUJOB_SERVICE_KEY_PREFIX; gpujob acl policy
# --service-prefix): routes and tokens. The trailing slash keeps every other
# namespace out of reach, also one whose name starts with this one's ("team"
# and "team-b"). Consul applies the longest matching prefix, so this rule
# wins over the one above inside the namespace.
key_prefix "{{.ServicePrefix}}/{{.Namespace}}/" {
  policy = "{{.Access}}"
}

# gpujob service status: the replicas' health.
service_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
