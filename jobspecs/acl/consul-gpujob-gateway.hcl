# Consul policy of the gpujob gateways' token: they read the services'
# routes and tokens (KV) and their replicas' health, and keep their own
# records (load reports under a session each, the autoscaling lock).
#
#   consul acl policy create -name gpujob-gateway -rules @jobspecs/acl/consul-gpujob-gateway.hcl
#   consul acl token create -policy-name gpujob-gateway -description "gpujob gateways"
#
# The token reaches the gateways through the Nomad variable
# nomad/jobs/gpujob-gateway (gpujob gateway render --secrets).
# scripts/dev-up.sh does all this with GPUJOB_DEV_ACL=1.

# Routes and tokens ("gpujob/services": GPUJOB_SERVICE_KEY_PREFIX).
key_prefix "gpujob/services/" {
  policy = "read"
}

# The gateways' own tree (gpujob gateway run --gateway-prefix).
key_prefix "gpujob/gateway/" {
  policy = "write"
}

# The replicas' health; Consul filters a health query by both.
service_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}

# A session per gateway for its load report, and one for the lock.
session_prefix "" {
  policy = "write"
}
