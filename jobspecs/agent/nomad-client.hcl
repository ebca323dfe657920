# Nomad client agent with the gpujob plugins installed.
#
# This is what scripts/dev-up.sh renders for client 1 of the local dev
# cluster (defaults: GPUJOB_DEV_DIR=/tmp/gpujob-dev, fake GPUs). Client i
# binds 127.0.0.(i+1) with the same port numbers, so several clients share one
# machine; on a real GPU host there is one client, bound to an internal
# address, with backend = "nvml".
#
# Installing the plugins:
#   1. `make build` puts bin/nomad-device-gpujob and bin/nomad-driver-gpujob
#      into the checkout; copy them into plugin_dir on every client.
#   2. Add the two plugin blocks below. A block's label must equal the
#      executable's file name in plugin_dir, or Nomad ignores the config.
#   3. Restart the client; `nomad node status -verbose <node>` then lists the
#      nvidia/gpu devices and the gpujob driver.
#
#   nomad agent -config jobspecs/agent/nomad-client.hcl

name                 = "gpujob-dev-client-1"
datacenter           = "dc1"
data_dir             = "/tmp/gpujob-dev/client-1/data"
log_level            = "INFO"
disable_update_check = true

# Absolute path of the directory holding the external plugins. Nomad runs
# every executable in it as a plugin and won't start if one isn't, so keep
# only plugins there (not the gpujob CLI).
plugin_dir = "/opt/gpujob/plugins"

# Each client on a shared machine gets its own loopback address (Linux
# routes all of 127.0.0.0/8 to lo), so every client keeps the default ports.
bind_addr = "127.0.0.2"

ports {
  http = 4646
  rpc  = 4647
  serf = 4648
}

# Required with a loopback bind_addr outside `-dev` mode.
advertise {
  http = "127.0.0.2:4646"
  rpc  = "127.0.0.2:4647"
  serf = "127.0.0.2:4648"
}

client {
  enabled = true

  # The server's RPC address; no Consul auto-join needed on one machine.
  servers = ["127.0.0.1:4647"]

  # Task ports are allocated on this interface's address (127.0.0.1 here).
  network_interface = "lo"

  # All clients on one machine fingerprint the same 127.0.0.1, so give each
  # its own dynamic port range, or two clients could hand out the same port.
  min_dynamic_port = 20000
  max_dynamic_port = 20999

  # cgroups v1: each client reconciles the cpuset cgroups under its parent
  # and removes ones it doesn't know, so clients sharing a machine must not
  # share the default "/nomad" parent.
  cgroup_parent = "/gpujob-dev-client-1"

  # Skip fingerprinting drivers a GPU training host doesn't use. For
  # training in images (`image` in a train spec) take docker off the list
  # and add the docker plugin block below.
  options {
    "driver.denylist" = "docker,qemu,java"
  }
}

consul {
  address = "127.0.0.1:8500"
}

# raw_exec runs the e2e test workloads and plain host processes. Disable it
# on shared production clients: it runs tasks unisolated, as the agent's user.
plugin "raw_exec" {
  config {
    enabled = true
  }
}

# Nomad's docker driver, for container members (scripts/dev-up.sh with
# GPUJOB_DEV_DOCKER=1 renders this): both mounts of a container member are
# host paths (the run directory /run/gpujob/<alloc> and the checkpoint
# directory), so bind mounts must be allowed. A task whose GPU reservation
# sets NVIDIA_VISIBLE_DEVICES runs under the dockerd runtime named "nvidia"
# (the NVIDIA Container Runtime on GPU hosts).
#
# plugin "docker" {
#   config {
#     volumes {
#       enabled = true
#     }
#     allow_privileged = false
#   }
# }

# GPU device plugin: fingerprints GPUs (and their health) and reports them to
# the scheduler as nvidia/gpu devices, with the same attribute names as
# HashiCorp's nomad-device-nvidia (memory, power, bar1, driver_version, ...).
plugin "nomad-device-gpujob" {
  config {
    enabled            = true
    backend            = "fake"        # "nvml" on a machine with an NVIDIA driver
    fingerprint_period = "1m"
    ignored_gpu_ids    = []            # UUIDs the scheduler must never hand out
    health {
      # XIDs that are the application's fault, not the card's: they must not
      # mark a GPU unhealthy.
      ignored_xids = [13, 31, 43, 45, 68, 109]
    }
    # Used only with backend = "fake": GPUs that don't exist, for testing
    # scheduling on machines without NVIDIA hardware.
    fake {
      count      = 4
      model      = "Tesla T4"
      memory_mib = 15360
      id_seed    = "client-1"          # makes fake UUIDs differ between clients on one machine
      # A JSON file that drives the fake GPUs while they run (utilisation,
      # memory, temperature, power, health; docs/reference/device-plugin.md "Without NVML"):
      control_file = "/tmp/gpujob-dev/fake-gpus/gpujob-dev-client-1.json"
    }
  }
}

# gpujob task driver: starts the workers of a distributed training group and
# injects rank and rendezvous (from Consul) into them. Jobs select it by the
# driver's plugin name in `driver = "..."`. Plugins inherit the client's
# environment (scripts/dev-up.sh sets CONSUL_HTTP_ADDR and NOMAD_ADDR there).
plugin "nomad-driver-gpujob" {
  config {
    # The ranks of a task run as its `user`, else as default_user; the
    # supervisor stays root to keep the Consul token from them. A task that
    # would run as root (user "root", or default_user = "root") is refused
    # unless allow_root = true. scripts/dev-up.sh keeps both defaults.
    # default_user = "nobody"
    # allow_root   = false
    #
    # Who tasks may run as: allowed_users for every namespace (default_user
    # must be one), namespace_users instead for the namespaces it lists, its
    # first user that namespace's default. Give each tenant a Unix user of
    # its own: jobs that share a user share trust. gpujob's own accounts
    # (gpujob-*) are never allowed.
    # allowed_users   = ["nobody"]
    # namespace_users = { "team-a" = ["team-a"], "team-b" = ["team-b"] }
    #
    # The most processes and threads one task may have (cgroup pids
    # controller); 0 turns the limit off.
    # pids_limit = 4096
    #
    # Which of this agent's own environment variables reach the ranks
    # (names, or prefixes ending in *), on the host and in containers
    # alike, where the job, the task config or the image does not set them.
    # Nomad hands a host task the whole agent environment; the driver keeps
    # only these. Add what your machines need, e.g. "OPENBLAS_*" where
    # OPENBLAS_CORETYPE is set to keep an older OpenBLAS correct, or
    # "LD_LIBRARY_PATH". The agents' and clouds' tokens never pass.
    # host_env = ["PATH", "LANG", "LANGUAGE", "LC_*", "TZ"]
    #
    # The static supervisor (`make build`: bin/gpujob-supervisor) that the
    # driver copies into container members; outside plugin_dir, which
    # must hold plugins only.
    # container_supervisor = "/usr/local/lib/gpujob/gpujob-supervisor"
    #
    # With Consul ACLs and TLS (scripts/dev-up.sh with GPUJOB_DEV_ACL=1 and
    # GPUJOB_DEV_TLS=1 renders these):
    #
    # consul {
    #   address   = "127.0.0.1:8500"   # the HTTPS port; https because ca_file is set
    #   token     = "<secret>"         # policy: jobspecs/acl/consul-gpujob-driver.hcl
    #   ca_file   = "/etc/gpujob/tls/consul-ca.pem"
    #   cert_file = "/etc/gpujob/tls/consul-cli.pem"
    #   key_file  = "/etc/gpujob/tls/consul-cli-key.pem"
    # }
    #
    # Unset fields fall back to the client's CONSUL_HTTP_ADDR,
    # CONSUL_HTTP_TOKEN, CONSUL_CACERT, CONSUL_CLIENT_CERT and
    # CONSUL_CLIENT_KEY. The driver reads the files and hands token and
    # certificates to each task's supervisor in a file of the task's private
    # directory (tmpfs, not served by Nomad's file API); the ranks never see
    # them in their environment. Nomad's /v1/agent/self shows plugin configs
    # to holders of agent:read, which only a management token has under the
    # policies of jobspecs/acl/.
  }
}

# With GPUJOB_DEV_ACL=1 / GPUJOB_DEV_TLS=1 every Nomad agent also has
#
#   acl { enabled = true }
#   tls {
#     http = true, rpc = true, verify_server_hostname = true, verify_https_client = true
#     ca_file = ".../nomad-ca.pem", cert_file = ".../nomad-client.pem", key_file = ".../nomad-client-key.pem"
#   }
#   consul { ssl = true, verify_ssl = true, ca_file, cert_file, key_file, token }
#
# the consul token's policy being jobspecs/acl/consul-nomad-agent.hcl.
