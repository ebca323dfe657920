# Rendered by `gpujob sweep submit`: the controller of sweep bert-lr.

job "bert-lr-controller" {
  type        = "batch"
  datacenters = ["*"]
  namespace   = "default"
  meta = {
    gpujob       = "sweep-controller"
    gpujob_sweep = "bert-lr"
  }

  group "controller" {
    restart {
      attempts = 10
      interval = "10m"
      delay    = "1s"
      mode     = "fail"
    }

    reschedule {
      attempts       = 0
      unlimited      = true
      delay          = "5s"
      delay_function = "exponential"
      max_delay      = "5m"
    }

    task "ctl" {
      driver       = "raw_exec"
      user         = "nobody"
      kill_timeout = "10s"

      config {
        command = "/usr/local/bin/gpujob"
        args    = ["sweep", "controller", "--namespace", "default", "bert-lr"]
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }
  }
}
