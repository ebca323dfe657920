# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "bert-finetune" {
  type        = "batch"
  datacenters = ["*"]
  meta = {
    gpujob                 = "train"
    gpujob_gpus_per_worker = "1"
    gpujob_task            = "train"
    gpujob_workers         = "2"
  }

  group "train" {
    count = 2

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
        args         = ["/opt/gpujob/workloads/bert_finetune.py"]
        max_restarts = 3
        env = {
          GPUJOB_CHECKPOINT_EVERY = "20"
          OMP_NUM_THREADS         = "1"
        }

        rendezvous {
          nnodes       = "2"
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
