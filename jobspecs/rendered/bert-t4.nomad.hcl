# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "bert-t4" {
  type        = "batch"
  datacenters = ["dc1", "dc2"]
  namespace   = "ml"
  node_pool   = "gpu"
  priority    = 70
  meta = {
    "cost.center"          = "research-42"
    gpujob                 = "train"
    gpujob_gpus_per_worker = "2"
    gpujob_task            = "train"
    gpujob_workers         = "4"
    team                   = "nlp"
  }

  group "train" {
    count = 4

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
        args         = ["local/workloads/bert_finetune.py", "--epochs", "3", "--backend", "nccl"]
        max_restarts = 5
        env = {
          GPUJOB_CHECKPOINT_EVERY = "50"
          NCCL_DEBUG              = "WARN"
        }

        rendezvous {
          nnodes       = "4"
          port         = "rdzv"
          join_timeout = "10m"
        }
      }

      artifact {
        source      = "git::https://github.com/gpujob/gpujob//jobspecs/workloads"
        destination = "local/workloads"
        options {
          ref = "main"
        }
      }

      resources {
        cpu    = 4000
        memory = 10240

        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.model}"
            value     = "Tesla T4"
          }

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "15 GiB"
          }
        }
      }
    }
  }
}
