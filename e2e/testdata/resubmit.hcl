# The "resubmission after a dead run" row of the fault matrix: a short
# two-worker run with a budget of one group restart.
variable "workload" {
  type = string
}

variable "steps" {
  type    = string
  default = "240"
}

train "e2e-fault-resubmit" {
  workers         = 2
  gpus_per_worker = 1
  command         = "/usr/bin/python3"
  args            = [var.workload, "--steps", var.steps, "--sleep-per-step", "0.05", "--log-every", "20"]
  env = {
    OMP_NUM_THREADS = "1"
  }
  resources {
    cpu    = 500
    memory = 1024
  }
  checkpoint {
    every = 20
  }
  max_failures       = 1
  rendezvous_timeout = "2m"
}
