train "e2e-cli-bad" {
  workers = 0
  command = "/bin/true"
  worker  = 2
}
