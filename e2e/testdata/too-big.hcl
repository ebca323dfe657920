# Two workers of two GPUs: fits a 4-GPU node only when nothing holds its GPUs.
train "e2e-cli-too-big" {
  workers         = 2
  gpus_per_worker = 2
  command         = "/bin/true"
}
