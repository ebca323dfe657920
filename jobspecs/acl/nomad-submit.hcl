# Nomad policy of a gpujob user: submit, watch, read logs of and stop
# training jobs in one namespace ("default" here; copy the file for
# another), and see the cluster's GPUs.
#
#   nomad acl policy apply -description "gpujob submitter" gpujob-submit jobspecs/acl/nomad-submit.hcl
#   nomad acl token create -name alice -policy gpujob-submit
#
# scripts/dev-up.sh applies it with GPUJOB_DEV_ACL=1 and puts such a token in
# the env file as NOMAD_TOKEN.
namespace "default" {
  capabilities = [
    # gpujob submit: plan and register (parsing the rendered jobspec with
    # the agent's parser is allowed with submit-job); gpujob stop.
    "submit-job",
    # submit's progress, status, logs: the job, its allocations and
    # evaluations, and their task events.
    "read-job",
    # gpujob list.
    "list-jobs",
    # gpujob logs, submit --logs, and the log tail and result in status.
    "read-logs",
    # gpujob service scale.
    "scale-job",
  ]
}

# gpujob gpus, and submit's check that the spec fits a node: nodes, their
# devices, allocations and GPU stats.
node {
  policy = "read"
}
