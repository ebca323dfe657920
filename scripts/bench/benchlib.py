"""Shared pieces of the benchmark harnesses in scripts/bench/.

Every harness runs the configurations it compares interleaved within one invocation
(run i measures each configuration once, in an order rotated by i, so a slow minute of
a shared machine hits every column alike) and prints, per configuration, the median and
the range of its runs.

Processes: everything a harness starts carries BENCH_TAG=<tag of this invocation> (and
usually BENCH_TRIAL=<trial>) in its environment, inherited by every descendant, including
the ranks a Nomad task starts. That is how a harness finds what is left of a trial, waits
for it to be gone, and, on exit, kills exactly its own leftovers by PID.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch


def new_tag(prefix):
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


# ---- statistics -------------------------------------------------------------------------


def summary(values):
    """median, min, max and n of a list of numbers (None entries are failed runs)."""
    ok = [v for v in values if v is not None]
    if not ok:
        return {"n": 0, "failed": len(values)}
    return {"median": statistics.median(ok), "min": min(ok), "max": max(ok), "n": len(ok),
            "failed": len(values) - len(ok)}


def fmt(s, unit="s", digits=2):
    """'4.21 s (3.90-5.02, n=5)' from summary()."""
    if s["n"] == 0:
        return f"no run succeeded ({s['failed']} failed)"
    fail = f", {s['failed']} failed" if s["failed"] else ""
    return (f"{s['median']:.{digits}f} {unit} ({s['min']:.{digits}f}-{s['max']:.{digits}f}, "
            f"n={s['n']}{fail})")


def all_succeeded(figures):
    """Whether every configuration in figures ({key: [value or None]}) had a run that
    succeeded: a harness's exit status."""
    return all(summary(v)["n"] for v in figures.values())


def emit(out, path=None):
    """Prints the machine-readable result out as one JSON line; also writes it to path
    (the harness's --json) when given."""
    print(json.dumps(out))
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh)


def rotated(items, i):
    """items rotated left by i: run i measures the configurations in this order."""
    k = i % len(items)
    return items[k:] + items[:k]


# ---- processes ----------------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_with_env(key, value):
    """PIDs of live processes whose environment holds key=value."""
    want = f"{key}={value}".encode()
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat", "rb") as f:
                state = f.read().rsplit(b") ", 1)[1][:1]
        except OSError:
            continue
        if want in env and state != b"Z":
            out.append(int(d))
    return out


def wait_gone(key, value, timeout):
    """Waits until no process carries key=value; kills what is left after timeout.
    Returns the PIDs that had to be killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pids_with_env(key, value):
            return []
        time.sleep(0.1)
    left = pids_with_env(key, value)
    kill_pids(left)
    return left


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_tagged(tag):
    """SIGKILLs every process of this invocation (by PID), until none is left."""
    for _ in range(20):
        left = pids_with_env("BENCH_TAG", tag)
        if not left:
            return
        kill_pids(left)
        time.sleep(0.1)


def run_trial(label, trial, measure):
    """One measurement: measure(cleanup) returns the figure, after appending to cleanup
    what undoes what it started. Returns the figure, or None when measure raised (one
    failed run is reported, the others go on). Either way the cleanup runs and the trial
    is over only once no process carries BENCH_TRIAL=trial (what is left 60 s on is
    killed), so the next trial starts on a quiet machine."""
    cleanup = []
    try:
        v = measure(cleanup)
        log(f"{label}: {v:.3f} s")
    except Exception as e:
        v = None
        log(f"{label}: FAILED: {type(e).__name__}: {e}")
    finally:
        for f in cleanup:
            f()
        left = wait_gone("BENCH_TRIAL", trial, 60)
        if left:
            log(f"{label}: killed {len(left)} process(es) left 60 s after the stop")
    return v


@contextlib.contextmanager
def scratch_dir(tag):
    """A scratch directory for the invocation tagged tag; on leaving, however that
    happens, every process of the invocation is killed and the directory removed."""
    scratch = tempfile.mkdtemp(prefix=tag + "-")
    try:
        yield scratch
    finally:
        kill_tagged(tag)
        shutil.rmtree(scratch, ignore_errors=True)


def exit_on_signals():
    """SIGTERM/SIGHUP raise SystemExit so finally blocks (cleanup) run."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


# ---- Nomad (the dev cluster scripts/bench/with-dev-cluster.sh started) ---------------------


class Nomad:
    def __init__(self):
        self.addr = os.environ["NOMAD_ADDR"]
        self.bin = os.environ.get("NOMAD_BIN") or "nomad"

    def call(self, method, path):
        """The JSON answer of one HTTP API request (None for an empty one)."""
        req = urllib.request.Request(self.addr + path, method=method)
        with urllib.request.urlopen(req, timeout=60) as r:
            body = r.read()
        return json.loads(body) if body else None

    def get(self, path):
        return self.call("GET", path)

    def run(self, hcl):
        """`nomad job run -detach` of the HCL text; returns when the CLI returns."""
        p = subprocess.run([self.bin, "job", "run", "-detach", "-"], input=hcl.encode(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise RuntimeError(f"nomad job run: {p.stdout.decode(errors='replace')}")

    def stop(self, job):
        subprocess.run([self.bin, "job", "stop", "-purge", "-detach", job],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def allocs(self, job):
        try:
            return self.get(f"/v1/job/{job}/allocations")
        except OSError:
            return []

    def failed_allocs(self, job):
        return [a for a in self.allocs(job) if a.get("ClientStatus") in ("failed", "lost")]


def hcl_str(s):
    return json.dumps(s)  # a JSON string is a valid HCL string


def hcl_list(items):
    return json.dumps(list(items))  # a JSON list of strings is a valid HCL list


def one_shot_job_hcl(job, group, task, count, driver, config, env, cpu, memory):
    """A batch job of one group of count members, each with a dynamic port "rdzv", that
    Nomad neither restarts nor reschedules: a harness measures exactly one attempt.
    config is the body of the task's config block, already indented (8 spaces); env is a
    dict of the task's environment."""
    envs = "\n".join(f"        {k} = {hcl_str(v)}" for k, v in env.items())
    return one_shot_group_hcl(job, group, count, f"""    task "{task}" {{
      driver = "{driver}"
      config {{
{config}
      }}
      env {{
{envs}
      }}
      resources {{
        cpu    = {cpu}
        memory = {memory}
      }}
    }}""")


def one_shot_group_hcl(job, group, count, tasks):
    """one_shot_job_hcl's job around tasks, the group's task blocks (indented 4 spaces)."""
    return f"""
job "{job}" {{
  datacenters = ["*"]
  type        = "batch"
  group "{group}" {{
    count = {count}
    network {{
      port "rdzv" {{}}
    }}
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
{tasks}
  }}
}}
"""


# ---- Consul and the gpujob CLI (the queue harnesses) ---------------------------------------

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUEUE_CONFIG_KEY = "gpujob/queues/config"
QUEUE_LEADER_KEY = "gpujob/queues/state/leader"


class Consul:
    """The dev cluster's Consul (CONSUL_HTTP_ADDR; no ACLs or TLS)."""

    def __init__(self):
        addr = os.environ["CONSUL_HTTP_ADDR"]
        self.base = addr if "://" in addr else "http://" + addr

    def call(self, method, path):
        """The JSON answer of one request; None for Consul's 404."""
        req = urllib.request.Request(self.base + path, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def leader_session(self):
        """The session holding the queue controller's leader key, None when none does."""
        kv = self.call("GET", "/v1/kv/" + QUEUE_LEADER_KEY)
        return kv[0].get("Session") if kv else None


def gpujob(*args, check=True):
    """Runs the checkout's bin/gpujob; its output (stdout and stderr). check: a non-zero
    exit raises."""
    p = subprocess.run([os.path.join(REPO, "bin", "gpujob"), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"gpujob {' '.join(args)} exited {p.returncode}: {p.stdout}")
    return p.stdout
