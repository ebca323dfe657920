#!/usr/bin/env python3
"""Bootstraps the ACLs of a dev cluster started by scripts/dev-up.sh.

  dev-acl.py consul STATE_DIR CONSUL_URL POLICY_DIR NODE...
      Waits for the management token (Consul's first leader creates it from
      the servers' acl.tokens.initial_management), applies the Consul
      policies in POLICY_DIR, and creates each token with the secret dev-up
      made for it: the agents' own (a node identity each; NODE... are the
      agents' node names, in the order of their secrets), the Nomad agents',
      the task driver's, a gpujob user's for the sweeps and for the services
      of the namespace "default", the gateways', the exporters', the queues'
      (an operator's, a user's, the admission controller's).
  dev-acl.py nomad STATE_DIR NOMAD_URL POLICY_DIR
      Bootstraps Nomad's ACLs with the management secret dev-up made,
      applies the Nomad policies in POLICY_DIR, and creates the submit,
      read-only, gateway, exporter and queue controller tokens (Nomad picks their secrets;
      they are saved).
  dev-acl.py gateway STATE_DIR NOMAD_URL ACL TLS
      Writes the gateways' tokens (ACL 1) and TLS material (TLS 1) into the
      Nomad variable nomad/jobs/gpujob-gateway.
  dev-acl.py exporter STATE_DIR NOMAD_URL ACL TLS
      The same for the exporters: nomad/jobs/gpujob-exporter.
  dev-acl.py queue-controller STATE_DIR NOMAD_URL ACL TLS
      The same for the queue's admission controller:
      nomad/jobs/gpujob-queue-controller.

POLICY_DIR holds the policies as `gpujob acl policy NAME --namespace default`
prints them, in NAME.hcl (dev-up renders them): those of a namespace's users
are templates of the namespace (jobspecs/acl/).

Secrets are read from and written to STATE_DIR/secrets; they never appear
on a command line. With TLS (STATE_DIR/tls exists) the requests verify the
cluster's CAs and present the -cli certificates. Python rather than curl
and shell: JSON bodies with secrets in them are built and parsed safely.
"""
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

DEADLINE = time.monotonic() + float(os.environ.get("GPUJOB_DEV_ACL_TIMEOUT", "60"))


class API:
    def __init__(self, base, header, token_file, tls_dir, api):
        self.base = base.rstrip("/")
        self.header = header
        self.token = read(token_file) if token_file else ""
        self.ctx = None
        if base.startswith("https://"):
            self.ctx = ssl.create_default_context(cafile=os.path.join(tls_dir, api + "-ca.pem"))
            self.ctx.load_cert_chain(os.path.join(tls_dir, api + "-cli.pem"), os.path.join(tls_dir, api + "-cli-key.pem"))

    def call(self, method, path, body=None, token=True):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if token and self.token:
            req.add_header(self.header, self.token)
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def retry(self, what, method, path, body=None, token=True):
        """Calls until it succeeds: right after an election the ACL
        system may not be ready yet."""
        while True:
            try:
                return self.call(method, path, body, token)
            except (urllib.error.URLError, OSError) as e:
                detail = e
                if isinstance(e, urllib.error.HTTPError):
                    detail = "%s %s" % (e.code, e.read().decode(errors="replace").strip())
                    # 403 and 5xx pass while the ACL system starts; a
                    # request it rejects for what it says never will.
                    if e.code != 403 and e.code < 500:
                        sys.exit("error: %s: %s" % (what, detail))
                if time.monotonic() > DEADLINE:
                    sys.exit("error: %s: %s" % (what, detail))
                time.sleep(0.3)


def read(path):
    with open(path) as f:
        return f.read().strip()


def save(secrets, name, secret, header):
    old = os.umask(0o077)
    try:
        with open(os.path.join(secrets, name + ".token"), "w") as f:
            f.write(secret + "\n")
        with open(os.path.join(secrets, name + ".header"), "w") as f:
            f.write("%s: %s\n" % (header, secret))
    finally:
        os.umask(old)


def consul(state, url, policy_dir, nodes):
    secrets = os.path.join(state, "secrets")
    api = API(url, "X-Consul-Token", os.path.join(secrets, "consul-management.token"),
              os.path.join(state, "tls"), "consul")
    api.retry("waiting for Consul's management token", "GET", "/v1/acl/token/self")
    policies = {
        "gpujob-driver": ("consul-driver", "gpujob task driver: the supervisors' rendezvous"),
        "gpujob-nomad-agent": ("consul-nomad-agent", "Nomad agents' Consul integration"),
        "gpujob-sweeps": ("consul-sweeps", "gpujob user in namespace default: sweep status, best, report, stop"),
        "gpujob-services": ("consul-services", "gpujob user in namespace default: service deploy, status, stop; tokens"),
        "gpujob-gateway": ("consul-gateway", "gpujob gateways: routes, tokens, health, load reports"),
        "gpujob-exporter": ("consul-exporter", "gpujob exporters: read the sweeps"),
        "gpujob-queues": ("consul-queues", "gpujob operators: apply queue files"),
        "gpujob-queues-read": ("consul-queues-read", "gpujob users: read the queue configuration"),
        "gpujob-queue-submit": ("consul-queue-submit", "gpujob user in namespace default: queue jobs, read their statuses"),
        "gpujob-queue-controller": ("consul-queue-controller", "gpujob queue admission controller: the queue state"),
    }
    for name, (policy, desc) in policies.items():
        rules = read(os.path.join(policy_dir, policy + ".hcl"))
        api.retry("creating the Consul policy " + name, "PUT", "/v1/acl/policy",
                  {"Name": name, "Description": desc, "Rules": rules})
    agents = ["consul-agent-server-%d" % (i + 1) for i in range(len(nodes))]
    if len(nodes) > 1:
        # Several servers: the last node name is the client agent's.
        agents = ["consul-agent-server-%d" % (i + 1) for i in range(len(nodes) - 1)] + ["consul-agent-client"]
    for secret_name, node in zip(agents, nodes):
        api.retry("creating the agent token of " + node, "PUT", "/v1/acl/token", {
            "SecretID": read(os.path.join(secrets, secret_name + ".token")),
            "Description": "Consul agent " + node,
            "NodeIdentities": [{"NodeName": node, "Datacenter": "dc1"}],
        })
    for secret_name, policy, desc in [
        ("consul-nomad", "gpujob-nomad-agent", "Nomad agents (consul { token })"),
        ("consul-driver", "gpujob-driver", "gpujob task driver (plugin consul { token })"),
        ("consul-sweeps", "gpujob-sweeps", "gpujob user: sweeps (CONSUL_HTTP_TOKEN)"),
        ("consul-services", "gpujob-services", "gpujob user: services (CONSUL_HTTP_TOKEN)"),
        ("consul-gateway", "gpujob-gateway", "gpujob gateways (the variable nomad/jobs/gpujob-gateway)"),
        ("consul-exporter", "gpujob-exporter", "gpujob exporters (the variable nomad/jobs/gpujob-exporter)"),
        ("consul-queues", "gpujob-queues", "gpujob operator: queue files (CONSUL_HTTP_TOKEN)"),
        ("consul-queue-user", "gpujob-queue-submit gpujob-queues-read", "gpujob user: queued jobs (CONSUL_HTTP_TOKEN)"),
        ("consul-queue-controller", "gpujob-queue-controller",
         "gpujob queue controller (the variable nomad/jobs/gpujob-queue-controller)"),
    ]:
        api.retry("creating the Consul token " + secret_name, "PUT", "/v1/acl/token", {
            "SecretID": read(os.path.join(secrets, secret_name + ".token")),
            "Description": desc,
            "Policies": [{"Name": p} for p in policy.split()],
        })


def nomad(state, url, policy_dir):
    secrets = os.path.join(state, "secrets")
    api = API(url, "X-Nomad-Token", None, os.path.join(state, "tls"), "nomad")
    management = read(os.path.join(secrets, "nomad-management.token"))
    api.retry("bootstrapping Nomad's ACLs", "POST", "/v1/acl/bootstrap", {"BootstrapSecret": management}, token=False)
    api.token = management
    policies = {
        "gpujob-submit": ("nomad-submit", "gpujob in namespace default: submit, watch, logs and stop training jobs"),
        "gpujob-readonly": ("nomad-readonly", "gpujob in namespace default: gpus, status, list and logs, read only"),
        "gpujob-gateway": ("nomad-gateway", "gpujob gateways: scale services"),
        "gpujob-exporter": ("nomad-exporter", "gpujob exporters: read nodes, jobs, allocations, logs"),
        "gpujob-queue-controller": ("nomad-queue-controller", "gpujob queue controller: read and register jobs"),
    }
    for name, (policy, desc) in policies.items():
        rules = read(os.path.join(policy_dir, policy + ".hcl"))
        api.retry("creating the Nomad policy " + name, "POST", "/v1/acl/policy/" + name,
                  {"Name": name, "Description": desc, "Rules": rules})
    for secret_name, policy in [("nomad-submit", "gpujob-submit"), ("nomad-readonly", "gpujob-readonly"),
                                ("nomad-gateway", "gpujob-gateway"), ("nomad-exporter", "gpujob-exporter"),
                                ("nomad-queue-controller", "gpujob-queue-controller")]:
        tok = api.retry("creating the Nomad token " + secret_name, "POST", "/v1/acl/token",
                        {"Name": secret_name, "Type": "client", "Policies": [policy]})
        save(secrets, secret_name, tok["SecretID"], "X-Nomad-Token")


def helper_variable(state, url, acl, tls, job):
    """Writes the tokens (ACL 1) and Consul's TLS material (TLS 1) of one of
    gpujob's own jobs — the gateways, the exporters, the queue controller —
    into the Nomad variable nomad/jobs/JOB, which the job reads with its
    workload identity (their renders' --secrets; queue apply with ACLs or
    TLS): consul-X and nomad-X are the tokens of job gpujob-X. Nomad needs
    no TLS material: the jobs reach it through their Task API socket."""
    secrets = os.path.join(state, "secrets")
    api = API(url, "X-Nomad-Token", None, os.path.join(state, "tls"), "nomad")
    short = job[len("gpujob-"):]
    items = {}
    if acl == "1":
        api.token = read(os.path.join(secrets, "nomad-management.token"))
        items["consul_token"] = read(os.path.join(secrets, "consul-" + short + ".token"))
        items["nomad_token"] = read(os.path.join(secrets, "nomad-" + short + ".token"))
    if tls == "1":
        t = os.path.join(state, "tls")
        for item, f in [("consul_ca_pem", "consul-ca.pem"), ("consul_cert_pem", "consul-cli.pem"),
                        ("consul_key_pem", "consul-cli-key.pem")]:
            items[item] = read(os.path.join(t, f)) + "\n"
    path = "nomad/jobs/" + job
    api.retry("writing the variable " + path, "PUT", "/v1/var/" + path,
              {"Namespace": "default", "Path": path, "Items": items})


HELPER_JOBS = {"gateway": "gpujob-gateway", "exporter": "gpujob-exporter", "queue-controller": "gpujob-queue-controller"}


def main(argv):
    if len(argv) >= 5 and argv[1] == "consul":
        consul(argv[2], argv[3], argv[4], argv[5:])
    elif len(argv) == 5 and argv[1] == "nomad":
        nomad(argv[2], argv[3], argv[4])
    elif len(argv) == 6 and argv[1] in HELPER_JOBS:
        helper_variable(argv[2], argv[3], argv[4], argv[5], HELPER_JOBS[argv[1]])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
