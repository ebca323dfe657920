# Serves the classifier jobspecs/examples/bert-finetune.hcl trains, from its
# checkpoint, behind the gpujob gateway: bearer tokens, 10 requests/s per
# token, 1 to 4 replicas of 1 GPU scaled on the requests in flight, and
# rolling updates through a canary that is promoted once healthy (and
# reverted when it never is).
#
#   gpujob service deploy jobspecs/examples/serve-bert.hcl
#   gpujob token create --service bert-clf
#   curl -H "Authorization: Bearer $TOKEN" -d '{"text":"a great film"}' $GATEWAY/bert-clf/predict

variable "workload" {
  type        = string
  default     = "/opt/gpujob/workloads/serve.py"
  description = "path of serve.py on every client (next to bert_finetune.py, which it imports)"
}

variable "checkpoint" {
  type        = string
  default     = "/srv/ckpt/bert-finetune"
  description = "the training run's checkpoint directory, readable on every client"
}

variable "version" {
  type    = string
  default = "v1"
}

service "bert-clf" {
  gpus_per_replica = 1
  command          = "/usr/bin/python3"
  args             = [var.workload, "--checkpoint", var.checkpoint]
  version          = var.version

  replicas {
    min     = 1
    max     = 4
    initial = 2
  }

  health {
    path          = "/healthz"
    interval      = "2s"
    timeout       = "1s"
    initial_delay = "10m" # model loading: never killed before this
  }

  update {
    canary       = 1
    max_parallel = 1
    auto_promote = true
    auto_revert  = true
  }

  autoscale {
    target_inflight  = 2 # per replica
    scale_down_delay = "5m"
  }

  route {
    auth = true
    rate_limit {
      rps   = 10 # per token
      burst = 20
    }
  }

  resources {
    cpu    = 1000
    memory = 2048
  }
}
