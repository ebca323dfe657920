# Consul policy of the queue admission controller's token
# (internal/queue/admit): the controller alone writes the queue state, so no
# token a job's processes can reach (the driver's, a namespace's users') can
# change a job's status, take the controller's leader key or forge an
# admission.
#
#   gpujob acl policy consul-queue-controller > queue-controller.hcl
#   consul acl policy create -name gpujob-queue-controller -rules @queue-controller.hcl
#
# It reads the queue configuration (gpujob queue apply writes it).
key "gpujob/queues/config" {
  policy = "read"
}

# The queued jobs' records: read, and deleted once their job has ended.
key_prefix "gpujob/queues/jobs/" {
  policy = "write"
}

# The controller's own tree: every job's status and the leader key.
key_prefix "gpujob/queues/state/" {
  policy = "write"
}

# Its session (the leader's), on whichever node's agent it talks to.
session_prefix "" {
  policy = "write"
}
