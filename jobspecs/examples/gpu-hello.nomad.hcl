# Two allocations of two GPUs each: every allocation prints the GPUs the
# nomad-device-gpujob plugin reserved for it. `make demo` runs this job.
job "gpu-hello" {
  datacenters = ["*"]
  type        = "batch"

  group "hello" {
    count = 2

    restart {
      attempts = 0
      mode     = "fail"
    }

    task "hello" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          echo "allocation $NOMAD_ALLOC_INDEX on $(hostname): CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
          if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi
        EOT
        ]
      }

      resources {
        cpu    = 100
        memory = 64

        device "nvidia/gpu" {
          count = 2
        }
      }
    }
  }
}
