# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "bert-lr-trial-001" {
  type        = "batch"
  datacenters = ["*"]
  meta = {
    gpujob                 = "train"
    gpujob_gpus_per_worker = "1"
    gpujob_sweep           = "bert-lr"
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
        args         = ["/opt/gpujob/workloads/bert_finetune.py", "--lr", "0.0003", "--layers", "1", "--epochs", "2"]
        max_restarts = 3
        env = {
          GPUJOB_CHECKPOINT_EVERY = "40"
          OMP_NUM_THREADS         = "1"
        }
        sweep = "bert-lr"
        trial = "trial-001"

        rendezvous {
          nnodes       = "1"
          port         = "rdzv"
          join_timeout = "5m"
        }
      }

      resources {
        cpu    = 1000
        memory = 1024

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
