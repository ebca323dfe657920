# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "toy-lr-trial-001" {
  type        = "batch"
  datacenters = ["*"]
  meta = {
    gpujob                 = "train"
    gpujob_gpus_per_worker = "1"
    gpujob_sweep           = "toy-lr"
    gpujob_task            = "train"
    gpujob_trial           = "trial-001"
    gpujob_workers         = "1"
  }

  group "train" {
    count = 1

    network {
      port "rdzv" {
      }
    }

    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "train" {
      driver       = "gpujob"
      kill_timeout = "30s"

      config {
        command      = "/usr/bin/python3"
        args         = ["/opt/gpujob/workloads/sweep_toy.py", "--lr", "0.00012652776796445088", "--width", "32", "--steps", "100", "--report-every", "10", "--sleep-per-step", "0.05"]
        max_restarts = 1
        env = {
          GPUJOB_CHECKPOINT_EVERY = "10"
          OMP_NUM_THREADS         = "1"
        }
        sweep = "toy-lr"
        trial = "trial-001"

        rendezvous {
          nnodes       = "1"
          port         = "rdzv"
          join_timeout = "5m"
        }
      }

      resources {
        cpu    = 300
        memory = 512

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
