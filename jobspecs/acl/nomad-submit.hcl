# Nomad policy of a gpujob user: submit, watch, read logs of and stop
# training jobs in ONE namespace, and see the cluster's GPUs.
#
# The file is a template (Go text/template; its blank is the namespace):
# render it for a namespace with gpujob, then apply what it prints:
#
#   gpujob acl policy nomad-submit --namespace team-a |
#     nomad acl policy apply -description "gpujob submitter in team-a" gpujob-submit-team-a -
#   nomad acl token create -name alice -policy gpujob-submit-team-a
#
# scripts/dev-up.sh renders it for the namespace "default" with
# GPUJOB_DEV_ACL=1 (as the policy gpujob-submit) and puts such a token in
# the env file as NOMAD_TOKEN. The user's Consul tokens come from
# consul-gpujob-sweeps.hcl and consul-gpujob-services.hcl, rendered for the
# same namespace.
namespace "{{.Namespace}}" {
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
