# Consul policy of a gpujob user's Consul token for services
# (CONSUL_HTTP_TOKEN): gpujob service deploy and stop write a service's
# route, gpujob token create, list and revoke its tokens (stored hashed),
# and gpujob service status reads its replicas' health.
#
#   consul acl policy create -name gpujob-services -rules @jobspecs/acl/consul-gpujob-services.hcl
#   consul acl token create -policy-name gpujob-services -description "alice: gpujob services"
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1 (make dev ACL=1) and
# saves such a token as secrets/consul-services.token.

# The services' tree ("gpujob/services": GPUJOB_SERVICE_KEY_PREFIX).
key_prefix "gpujob/services/" {
  policy = "write"
}

# gpujob service status: the replicas' health.
service_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
