# Nomad policy of a read-only gpujob user: gpujob gpus, status, list and
# logs, but no submit or stop, in ONE namespace.
#
# The file is a template (Go text/template; its blank is the namespace):
# render it for a namespace with gpujob, then apply what it prints:
#
#   gpujob acl policy nomad-readonly --namespace team-a |
#     nomad acl policy apply -description "gpujob read-only in team-a" gpujob-readonly-team-a -
#   nomad acl token create -name viewer -policy gpujob-readonly-team-a
#
# scripts/dev-up.sh renders it for the namespace "default" with
# GPUJOB_DEV_ACL=1 (as the policy gpujob-readonly).
namespace "{{.Namespace}}" {
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
