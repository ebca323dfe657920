# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "cpu-smoke" {
  type        = "batch"
  datacenters = ["*"]
  meta = {
    gpujob                 = "train"
    gpujob_gpus_per_worker = "0"
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
        args         = ["/opt/gpujob/workloads/bert_finetune.py", "--cpu", "--epochs", "1", "--train-size", "512", "--eval-size", "256"]
        workdir      = "/tmp"
        max_restarts = 1
        env = {
          GPUJOB_CHECKPOINT_EVERY = "10"
          OMP_NUM_THREADS         = "1"
        }

        rendezvous {
          nnodes       = "2"
          port         = "rdzv"
          join_timeout = "1m30s"
        }
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
