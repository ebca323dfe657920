# Consul policy of a gpujob user's Consul token for queued jobs, for ONE
# Nomad namespace: submit writes a queued job's record under the
# namespace's tree (and withdraws it), and gpujob status, list and queue
# status read the statuses the admission controller writes. --read-only
# renders read on both, for a user who only looks.
#
#   gpujob acl policy consul-queue-submit --namespace team-a > queue-submit-team-a.hcl
#   consul acl policy create -name gpujob-queue-submit-team-a -rules @queue-submit-team-a.hcl
#
# Why one policy per namespace: the controller registers a queued job with
# its own Nomad token. It registers a record only into the namespace its key
# names (and refuses a job whose namespace differs), so write on one
# namespace's records gives no more than submitting there.

key_prefix "gpujob/queues/jobs/{{.Namespace}}/" {
  policy = "{{.Access}}"
}

# Only read: the statuses are the controller's (consul-queue-controller).
key_prefix "gpujob/queues/state/status/{{.Namespace}}/" {
  policy = "read"
}
