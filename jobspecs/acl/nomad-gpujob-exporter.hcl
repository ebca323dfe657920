# Nomad policy of the gpujob exporters' token: they read the cluster to
# export it (gpujob exporter run): nodes and their GPU stats, every
# namespace's jobs and allocations, and the running training members' logs
# for their loss lines. Read only: nothing here submits, stops, scales or
# signals anything.
#
#   gpujob acl policy nomad-exporter |
#     nomad acl policy apply -description "gpujob exporters" gpujob-exporter -
#   nomad acl token create -name gpujob-exporter -policy gpujob-exporter
#
# The token reaches the exporters through the Nomad variable
# nomad/jobs/gpujob-exporter (gpujob exporter render --secrets).
# scripts/dev-up.sh does all this with GPUJOB_DEV_ACL=1. List the namespaces
# to export instead of "*" to narrow it; drop "read-logs" (and run the
# exporters with --loss-interval 0) to keep the jobs' logs from them, at the
# cost of the gpujob_train_loss series.
namespace "*" {
  capabilities = ["list-jobs", "read-job", "read-logs"]
}

# The nodes, their devices and their GPU stats (/v1/client/stats).
node {
  policy = "read"
}
