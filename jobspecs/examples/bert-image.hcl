# The BERT fine-tune of bert-finetune.hcl with every member in a container
# image, run by Nomad's docker driver: 2 workers of 1 GPU each, the same
# rendezvous, ranks, checkpoints every 20 steps and group restarts (up to 3)
# as on the host. The image needs only the workload's Python: gpujob's
# supervisor reaches the container through a read-only mount, and the
# checkpoint directory is mounted at the same path as on the host.
#
#   make dev DOCKER=1 && scripts/build-train-image.sh   # the local image gpujob-train:local
#   gpujob submit jobspecs/examples/bert-image.hcl
#   gpujob submit -var image=registry.example.com/ml/bert:1.4 jobspecs/examples/bert-image.hcl
#
# The clients need the docker driver with volumes enabled (the mounts are
# bind mounts from the host) and the gpujob driver's checkpoint_root as
# rendered (GPUJOB_CHECKPOINT_ROOT or --checkpoint-root when it is not
# /var/lib/gpujob/checkpoints).

variable "image" {
  type        = string
  default     = "gpujob-train:local" # scripts/build-train-image.sh; never :latest, which Nomad always pulls
  description = "the image every member runs in: Python and PyTorch, and the workload at var.workload"
}

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
  description = "path of bert_finetune.py inside the image"
}

variable "args" {
  type        = list(string)
  default     = []
  description = "extra arguments for the workload, e.g. [\"--epochs\", \"3\"]"
}

train "bert-image" {
  workers         = var.workers
  gpus_per_worker = var.gpus_per_worker

  image = var.image

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
    shm    = 256 # the container's /dev/shm (docker's shm_size), for DataLoader workers
  }

  checkpoint {
    every = 20
  }

  max_failures       = 3
  rendezvous_timeout = "5m"
}
