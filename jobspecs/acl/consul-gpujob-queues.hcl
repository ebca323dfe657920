# Consul policy of the queue configuration (gpujob queue). As rendered, for
# the operators who apply queue files (gpujob queue apply: a check-and-set
# transaction on this one key); with --read-only, for users, whose gpujob
# submit, gpujob service deploy, gpujob queue list and gpujob queue status
# read it.
#
#   gpujob acl policy consul-queues > queues-admin.hcl
#   gpujob acl policy consul-queues --read-only > queues-read.hcl
#   consul acl policy create -name gpujob-queues-admin -rules @queues-admin.hcl
#   consul acl policy create -name gpujob-queues-read -rules @queues-read.hcl
#
# A user's token without it still submits: a job that names no queue goes
# unchecked (with a warning), one that names a queue is refused, since its
# queue cannot be checked.
#
# The key lies outside every tree the other policies grant write on (the
# rendezvous, sweeps, services and gateway trees; gpujob acl policy refuses
# a --sweep-prefix or --service-prefix that would reach it): no job's
# processes, which can reach at most the driver's token and their
# namespace users' tokens, can write it. gpujob still checks what it reads
# there as strictly as a queue file. It is one exact key, not a prefix:
# the admission controller's own records will live beside it with rules
# of their own.
key "gpujob/queues/config" {
  policy = "{{.Access}}"
}
