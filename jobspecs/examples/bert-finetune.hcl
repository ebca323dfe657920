# Data-parallel fine-tune of the BERT-style classifier in
# jobspecs/workloads/bert_finetune.py: 2 workers of 1 GPU each meet in the
# gpujob driver's rendezvous, train together, checkpoint every 20 steps and
# restart together from the last checkpoint (up to 3 times) when one fails.
# It renders to the equivalent of jobspecs/bert-finetune.nomad.hcl.
#
#   gpujob submit jobspecs/examples/bert-finetune.hcl
#   gpujob submit -var workers=4 -var workload=$PWD/jobspecs/workloads/bert_finetune.py \
#     jobspecs/examples/bert-finetune.hcl

variable "workers" {
  type        = number
  default     = 2
  description = "allocations (nodes) in the group; each runs one rank per GPU"
}

variable "gpus_per_worker" {
  type    = number
  default = 1
}

variable "workload" {
  type        = string
  default     = "/opt/gpujob/workloads/bert_finetune.py"
  description = "path of bert_finetune.py on every client (shared storage or an artifact)"
}

variable "args" {
  type        = list(string)
  default     = []
  description = "extra arguments for the workload, e.g. [\"--epochs\", \"3\"]"
}

train "bert-finetune" {
  workers         = var.workers
  gpus_per_worker = var.gpus_per_worker

  command = "/usr/bin/python3"
  args    = concat([var.workload], var.args)

  # One thread per rank, as torchrun sets it: ranks sharing a node's cores
  # would otherwise oversubscribe them.
  env = {
    OMP_NUM_THREADS = "1"
  }

  resources {
    cpu    = 1000
    memory = 1024
  }

  checkpoint {
    every = 20
  }

  max_failures       = 3
  rendezvous_timeout = "5m"
}
