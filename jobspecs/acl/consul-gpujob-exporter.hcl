# Consul policy of the gpujob exporters' token: they read the sweeps'
# records (state and spec) for the gpujob_sweep_* series, and the queues'
# tree (configuration, queued jobs, the admission controller's statuses and
# counters) for the per-queue gpujob_queue_* series. Read only, and nothing
# else: Nomad registers the exporters' own service with its own token.
#
#   gpujob acl policy consul-exporter > exporter.hcl
#   consul acl policy create -name gpujob-exporter -rules @exporter.hcl
#   consul acl token create -policy-name gpujob-exporter -description "gpujob exporters"
#
# The token reaches the exporters through the Nomad variable
# nomad/jobs/gpujob-exporter (gpujob exporter render --secrets).
# scripts/dev-up.sh does all this with GPUJOB_DEV_ACL=1.

# Every namespace's sweeps ("gpujob/sweeps" by default: gpujob acl policy
# --sweep-prefix), read only.
key_prefix "{{.SweepPrefix}}/" {
  policy = "read"
}

# The queues' tree, read only: gpujob/queues/config, jobs/ and state/
# (internal/contract's QueuePrefix).
key_prefix "gpujob/queues/" {
  policy = "read"
}
