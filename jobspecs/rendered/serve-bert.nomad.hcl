# Rendered by `gpujob service render` from a service spec: edit the spec, not this file.

job "bert-clf" {
  type        = "service"
  datacenters = ["*"]
  meta = {
    gpujob         = "service"
    gpujob_task    = "serve"
    gpujob_version = "v1"
  }

  group "serve" {
    count = 2

    network {
      port "http" {
      }
    }

    scaling {
      enabled = true
      min     = 1
      max     = 4
    }

    update {
      max_parallel      = 1
      canary            = 1
      auto_promote      = true
      auto_revert       = true
      health_check      = "checks"
      min_healthy_time  = "5s"
      healthy_deadline  = "10m25s"
      progress_deadline = "15m38s"
    }

    restart {
      attempts = 3
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    task "serve" {
      driver         = "gpujob"
      shutdown_delay = "3s"
      kill_timeout   = "15s"

      config {
        command = "/usr/bin/python3"
        args    = ["/opt/gpujob/workloads/serve.py", "--checkpoint", "/srv/ckpt/bert-finetune"]
        service = true
        env = {
          GPUJOB_SERVICE_VERSION = "v1"
        }
      }

      env {
        PORT = "${NOMAD_PORT_http}"
      }

      service {
        name        = "bert-clf"
        port        = "http"
        provider    = "consul"
        tags        = ["gpujob", "gpujob-ns=default", "gpujob-version=v1"]
        canary_tags = ["gpujob", "gpujob-ns=default", "gpujob-version=v1", "gpujob-canary"]

        meta {
          gpujob_namespace = "default"
          gpujob_version   = "v1"
        }

        check {
          name     = "ready"
          type     = "http"
          path     = "/healthz"
          interval = "2s"
          timeout  = "1s"

          check_restart {
            limit = 3
            grace = "10m"
          }
        }
      }

      resources {
        cpu    = 1000
        memory = 2048

        device "nvidia/gpu" {
          count = 1
        }
      }
    }
  }
}
