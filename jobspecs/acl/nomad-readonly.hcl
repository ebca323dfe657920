# Nomad policy of a read-only gpujob user: gpujob gpus, status, list and
# logs, but no submit or stop. In one namespace ("default" here).
#
#   nomad acl policy apply -description "gpujob read-only" gpujob-readonly jobspecs/acl/nomad-readonly.hcl
#   nomad acl token create -name viewer -policy gpujob-readonly
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1.
namespace "default" {
  capabilities = [
    # gpujob status: the job, its allocations and their task events.
    "read-job",
    # gpujob list.
    "list-jobs",
    # the log tail and result line in gpujob status, and gpujob logs.
    "read-logs",
  ]
}

# gpujob gpus: nodes, their devices, allocations and GPU stats.
node {
  policy = "read"
}
