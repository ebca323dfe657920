# A train block whose name would lead out of the driver's checkpoint_root
# and into a Consul key raw (issue 8): validate and submit refuse it at its
# position, and nothing is registered.
train "../../../../../tmp/e2e-refused-escape" {
  command = "/bin/true"
}
