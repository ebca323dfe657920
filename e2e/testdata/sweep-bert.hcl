# A grid sweep of the BERT workload for the sweep end-to-end tests; the tests
# set the grid and the limits, and replace the sweep's name.
variable "workload" {
  type = string
}
variable "lrs" {
  type    = list(number)
  default = [0.0003, 0.003]
}
variable "layers" {
  type    = list(string)
  default = ["1", "2"]
}
variable "args" {
  type    = list(string)
  default = []
}
variable "max_trials" {
  type    = number
  default = 4
}
variable "parallel" {
  type    = number
  default = 2
}
variable "max_failed_trials" {
  type    = number
  default = 0
}

sweep "e2e" {
  train {
    workers         = 1
    gpus_per_worker = 1
    command         = "/usr/bin/python3"
    args            = concat([var.workload, "--lr", param.lr, "--layers", param.layers], var.args)
    env = {
      OMP_NUM_THREADS = "1"
    }
    resources {
      cpu    = 500
      memory = 1024
    }
    checkpoint {
      every = 16
    }
    max_failures = 1
  }
  param "lr" {
    grid = var.lrs
  }
  param "layers" {
    grid = var.layers
  }
  objective {
    metric = "accuracy"
  }
  search {
    algorithm = "grid"
  }
  max_trials        = var.max_trials
  parallel          = var.parallel
  max_failed_trials = var.max_failed_trials
}
