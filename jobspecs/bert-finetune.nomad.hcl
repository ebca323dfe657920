# Data-parallel fine-tune of the BERT-style classifier in
# jobspecs/workloads/bert_finetune.py with the gpujob task driver: `workers`
# allocations meet in a Consul rendezvous, get their ranks and the
# torchrun environment, start together and restart together from the last
# checkpoint when one of them fails.
#
#   nomad job run -var workload=$PWD/jobspecs/workloads/bert_finetune.py jobspecs/bert-finetune.nomad.hcl

variable "workers" {
  type        = number
  default     = 2
  description = "allocations (nodes) in the group; each runs nproc_per_node ranks"
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

variable "max_restarts" {
  type    = number
  default = 3
}

variable "join_timeout" {
  type    = string
  default = "5m"
}

job "bert-finetune" {
  datacenters = ["*"]
  type        = "batch"

  # What `gpujob render` writes: `gpujob status`, `list` and `top` then show
  # this job as a training job (members, ranks, why a member waits).
  meta {
    gpujob                 = "train"
    gpujob_task            = "train"
    gpujob_workers         = "${var.workers}"
    gpujob_gpus_per_worker = "${var.gpus_per_worker}"
  }

  group "train" {
    count = var.workers

    # MASTER_PORT: rank 0's allocated port; every member offers its own and
    # the rendezvous picks node rank 0's.
    network {
      port "rdzv" {}
    }

    # The driver restarts the whole group from its checkpoint (max_restarts
    # below); a Nomad restart of one member alone would only rejoin it.
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "train" {
      driver = "gpujob"

      config {
        command      = "/usr/bin/python3"
        args         = concat([var.workload], var.args)
        max_restarts = var.max_restarts

        # One thread per rank, as torchrun sets it: ranks sharing a node's
        # cores would otherwise oversubscribe them.
        env = {
          OMP_NUM_THREADS = "1"
        }

        rendezvous {
          nnodes       = "${var.workers}"
          port         = "rdzv"
          join_timeout = var.join_timeout
        }
      }

      resources {
        cpu    = 1000
        memory = 1024

        device "nvidia/gpu" {
          count = var.gpus_per_worker
        }
      }
    }
  }
}
