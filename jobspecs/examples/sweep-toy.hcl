# A random search with ASHA early stopping over jobspecs/workloads/sweep_toy.py,
# a seconds-long regression whose score (held-out R², higher is better) barely
# moves below lr 1e-3, peaks near lr 0.2 and collapses above ~0.35. ASHA judges
# the trials at steps 10, 30 and 90 and stops those below the top third.
#
#   gpujob sweep submit -var workload=$PWD/jobspecs/workloads/sweep_toy.py \
#     jobspecs/examples/sweep-toy.hcl
#   gpujob sweep report toy-lr -o toy-lr.png

variable "workload" {
  type        = string
  default     = "/opt/gpujob/workloads/sweep_toy.py"
  description = "path of sweep_toy.py on every client"
}

variable "args" {
  type        = list(string)
  default     = ["--steps", "100", "--report-every", "10", "--sleep-per-step", "0.05"]
  description = "arguments for every trial"
}

variable "max_trials" {
  type    = number
  default = 12
}

variable "seed" {
  type    = number
  default = 7
}

sweep "toy-lr" {
  train {
    workers         = 1
    gpus_per_worker = 1
    command         = "/usr/bin/python3"
    args            = concat([var.workload, "--lr", param.lr, "--width", param.width], var.args)
    env = {
      OMP_NUM_THREADS = "1"
    }
    resources {
      cpu    = 300
      memory = 512
    }
    checkpoint {
      every = 10
    }
    max_failures = 1
  }

  param "lr" {
    loguniform = [1e-4, 1]
  }
  param "width" {
    choice = [8, 32, 128]
  }

  objective {
    metric = "score"
    mode   = "max"
  }
  search {
    algorithm = "random"
    seed      = var.seed
  }
  early_stop "asha" {
    grace_period     = 10
    reduction_factor = 3
  }

  max_trials        = var.max_trials
  parallel          = 4
  max_failed_trials = 2
}
