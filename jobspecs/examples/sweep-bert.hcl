# A grid sweep of the BERT-style fine-tune in jobspecs/workloads/bert_finetune.py:
# two learning rates × two depths, two trials at a time, each trial one worker
# with one GPU. Rank 0 prints a gpujob-metric line with the evaluation accuracy
# at every checkpoint; the sweep keeps the best.
#
#   gpujob sweep submit -var workload=$PWD/jobspecs/workloads/bert_finetune.py \
#     jobspecs/examples/sweep-bert.hcl
#   gpujob sweep status bert-lr
#   gpujob sweep best bert-lr --as-train

variable "workload" {
  type        = string
  default     = "/opt/gpujob/workloads/bert_finetune.py"
  description = "path of bert_finetune.py on every client (shared storage or an artifact)"
}

variable "args" {
  type        = list(string)
  default     = ["--epochs", "2"]
  description = "extra arguments for every trial"
}

sweep "bert-lr" {
  train {
    workers         = 1
    gpus_per_worker = 1
    command         = "/usr/bin/python3"
    args            = concat([var.workload, "--lr", param.lr, "--layers", param.layers], var.args)
    env = {
      OMP_NUM_THREADS = "1"
    }
    resources {
      cpu    = 1000
      memory = 1024
    }
    checkpoint {
      every = 40
    }
  }

  param "lr" {
    grid = [3e-4, 2e-3]
  }
  param "layers" {
    grid = [1, 2]
  }

  objective {
    metric = "accuracy"
    mode   = "max"
  }
  search {
    algorithm = "grid"
  }

  max_trials        = 4
  parallel          = 2
  max_failed_trials = 1
}
