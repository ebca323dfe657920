# A job written for HashiCorp's nomad-device-nvidia plugin, unchanged: it asks
# for "nvidia/gpu" and constrains on the same attribute names and units, so it
# schedules on nodes running nomad-device-gpujob as well.
job "nvidia-compat" {
  datacenters = ["*"]
  type        = "batch"

  group "smi" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "t" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES\""]
      }

      resources {
        cpu    = 100
        memory = 64

        device "nvidia/gpu" {
          count = 1

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "8 GiB"
          }

          affinity {
            attribute = "${device.attr.power}"
            operator  = ">="
            value     = "50 W"
            weight    = 50
          }
        }
      }
    }
  }
}
