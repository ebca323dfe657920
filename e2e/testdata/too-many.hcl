# More workers than the dev cluster (one client of four GPUs) could hold even
# with nothing else running: submit refuses it before registering anything.
train "e2e-cli-too-many" {
  workers         = 5000
  gpus_per_worker = 1
  command         = "/bin/true"
}
