# A short training run for the CLI end-to-end tests.
variable "workload" {
  type = string
}

variable "workers" {
  type    = number
  default = 2
}

train "e2e-cli-train" {
  workers         = var.workers
  gpus_per_worker = 1
  command         = "/usr/bin/python3"
  args            = [var.workload, "--steps", "80", "--log-every", "10", "--no-resume"]
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
