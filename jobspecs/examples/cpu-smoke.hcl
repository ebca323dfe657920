# A CPU-only smoke test of the whole path (rendezvous, ranks, gloo, group
# restart) on any cluster: 2 workers, no GPUs, one short epoch.
#
#   gpujob submit -var workload=$PWD/jobspecs/workloads/bert_finetune.py jobspecs/examples/cpu-smoke.hcl

variable "workload" {
  type    = string
  default = "/opt/gpujob/workloads/bert_finetune.py"
}

variable "workers" {
  type    = number
  default = 2
}

train "cpu-smoke" {
  workers         = var.workers
  gpus_per_worker = 0

  command = "/usr/bin/python3"
  args    = [var.workload, "--cpu", "--epochs", "1", "--train-size", "512", "--eval-size", "256"]
  workdir = "/tmp"
  env = {
    OMP_NUM_THREADS = "1"
  }

  resources {
    cpu    = 500
    memory = 512
  }

  checkpoint {
    every = 10
  }

  max_failures       = 1
  rendezvous_timeout = "90s"
}
