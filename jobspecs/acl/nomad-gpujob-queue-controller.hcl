# Nomad policy of the queue admission controller's token (gpujob queue
# controller, internal/queue/admit): it reads every node and every
# namespace's jobs and allocations (a job of any namespace holds GPUs the
# queue must not hand out twice), plans and registers the queued jobs it
# admits, in their own namespaces, and stops the gangs it preempts.
#
#   gpujob acl policy nomad-queue-controller |
#     nomad acl policy apply -description "gpujob queue controller" gpujob-queue-controller -
#   nomad acl token create -name gpujob-queue-controller -policy gpujob-queue-controller
#
# The token reaches the controller through the Nomad variable
# nomad/jobs/gpujob-queue-controller (with its Consul token, of
# gpujob acl policy consul-queue-controller). Nomad's rules cannot name
# jobs: submit-job in every namespace is the least it admits with. List the
# namespaces whose jobs the queue admits instead of "*" to narrow it (the
# allocations of namespaces left out are then invisible to it, so keep
# GPU work out of them).
namespace "*" {
  capabilities = ["list-jobs", "read-job", "submit-job"]
}

# The nodes and their GPUs: what the queue admits against.
node {
  policy = "read"
}
