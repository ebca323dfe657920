# The BERT fine-tune on 4 nodes of 2 Tesla T4s (16 GiB) each, in the "ml"
# namespace and the "gpu" node pool, with the code fetched as an artifact
# and 2 GiB of /dev/shm for the DataLoader workers.
#
#   gpujob submit -var-file team.hcl jobspecs/examples/bert-t4.hcl

variable "epochs" {
  type    = number
  default = 3
}

variable "team" {
  type    = string
  default = "nlp"
}

train "bert-t4" {
  workers         = 4
  gpus_per_worker = 2

  command = "/usr/bin/python3"
  args    = ["local/workloads/bert_finetune.py", "--epochs", tostring(var.epochs), "--backend", "nccl"]
  env = {
    NCCL_DEBUG = "WARN"
  }

  artifact {
    source      = "git::https://github.com/gpujob/gpujob//jobspecs/workloads"
    destination = "local/workloads"
    options = {
      ref = "main"
    }
  }

  resources {
    cpu    = 4000
    memory = 8192
    shm    = 2048
  }

  gpu {
    model      = "Tesla T4"
    min_memory = "15 GiB"
  }

  checkpoint {
    every = 50
  }

  max_failures       = 5
  rendezvous_timeout = "10m"
  datacenters        = ["dc1", "dc2"]
  node_pool          = "gpu"
  namespace          = "ml"
  priority           = 70
  meta = {
    team          = var.team
    "cost.center" = "research-42"
  }
}
