# A CPU-only service of the same server with an untrained model: what the
# dev cluster and the e2e tests run. Two replicas, no autoscaling, no
# canaries: a rolling update replaces one replica at a time.
#
#   gpujob service deploy -var workload=$PWD/jobspecs/workloads/serve.py jobspecs/examples/serve-cpu.hcl

variable "workload" {
  type    = string
  default = "/opt/gpujob/workloads/serve.py"
}

variable "version" {
  type    = string
  default = "v1"
}

service "echo-clf" {
  gpus_per_replica = 0
  command          = "/usr/bin/python3"
  args             = [var.workload, "--no-checkpoint"]
  version          = var.version
  env = {
    OMP_NUM_THREADS = "1"
  }

  replicas {
    initial = 2
    min     = 2
  }

  health {
    interval      = "1s"
    timeout       = "1s"
    initial_delay = "30s"
  }

  update {
    min_healthy_time = "2s"
  }

  route {
    auth = true
    rate_limit {
      rps   = 10
      burst = 20
    }
  }

  resources {
    cpu    = 500
    memory = 512
  }
}
