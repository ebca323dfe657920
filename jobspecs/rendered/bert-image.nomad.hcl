# Rendered by `gpujob render` from a train spec: edit the spec, not this file.

job "bert-image" {
  type        = "batch"
  datacenters = ["*"]
  meta = {
    gpujob                 = "train"
    gpujob_gpus_per_worker = "1"
    gpujob_run             = ""
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

    task "gpujob" {
      driver       = "gpujob"
      kill_timeout = "30s"

      lifecycle {
        hook    = "prestart"
        sidecar = true
      }

      config {
        command        = "/usr/bin/python3"
        args           = ["/opt/gpujob/workloads/bert_finetune.py"]
        nproc_per_node = 1
        max_restarts   = 3
        env = {
          GPUJOB_CHECKPOINT_EVERY = "20"
          OMP_NUM_THREADS         = "1"
        }
        container_task  = "train"
        checkpoint_root = "/var/lib/gpujob/checkpoints"

        container_kill_timeout = "30s"

        rendezvous {
          nnodes       = "2"
          port         = "rdzv"
          join_timeout = "5m"
        }
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }

    task "train" {
      driver       = "docker"
      kill_timeout = "30s"

      user = "0"

      config {
        image        = "gpujob-train:local"
        entrypoint   = ["/gpujob/supervisor", "/gpujob/spec.json"]
        network_mode = "host"
        init         = true
        pids_limit   = 4096
        shm_size     = 268435456

        mount {
          type     = "bind"
          source   = "/run/gpujob/${NOMAD_ALLOC_ID}"
          target   = "/gpujob"
          readonly = true
        }

        mount {
          type     = "bind"
          source   = "/var/lib/gpujob/checkpoints/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"
          target   = "/var/lib/gpujob/checkpoints/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMAD_META_gpujob_run}"
          readonly = false
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
