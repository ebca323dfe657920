#!/usr/bin/python3
"""Admission latency: submit -> every process of an N-member gang running, through the queue vs direct.

Three ways to start the same train spec (N workers of 1 GPU each, whose rank writes a timestamp and
sleeps), interleaved, the cluster idle each time (capacity exists):

    nomad          `nomad job run -detach` of what `gpujob render` wrote (rendered before the clock
                   starts): the anchor the issue names
    submit         `gpujob submit --detach` with no queue configuration: gpujob's checks, then the
                   job registered directly
    submit-queue   `gpujob submit --detach` in queue mode: the record written into its queue, the
                   admission controller (a Nomad job, started by `gpujob queue apply`) plans and
                   registers it

The figure is the time from just before the command is executed to the last of the N timestamps.
Queue mode is switched per trial, outside the clock: `gpujob queue apply --no-controller` before a
submit-queue trial, the configuration key deleted before the others (the controller keeps running
and idles). Each trial's job is then stopped and purged (`gpujob stop --purge` for queued ones), and
the next starts once every process of it is gone.

Run it through the wrapper (which starts and stops the dev cluster):

    scripts/bench/queue-latency.sh [--runs 5] [--n 2]
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

ARMS = ["nomad", "submit", "submit-queue"]
TASK = 'date +%s.%N > "$BENCH_DIR/$NOMAD_ALLOC_ID"; exec sleep 300'
CONFIG_KEY = bl.QUEUE_CONFIG_KEY


def spec_hcl(name, n, env):
    envs = "\n".join(f"    {k} = {bl.hcl_str(v)}" for k, v in env.items())
    return f"""train "{name}" {{
  workers         = {n}
  gpus_per_worker = 1
  command         = "/bin/sh"
  args            = {bl.hcl_list(["-c", TASK])}
  env = {{
{envs}
  }}
  resources {{
    cpu    = 20
    memory = 64
  }}
  max_failures       = 0
  rendezvous_timeout = "2m"
}}
"""


def queue_mode(consul, on, queues_file):
    if on:
        bl.gpujob("queue", "apply", "--no-controller", queues_file)
    else:
        consul.call("DELETE", "/v1/kv/" + CONFIG_KEY)


def one(nomad, a, tag, trial, arm, out_dir, spec_path, cleanup):
    if arm == "submit-queue":
        cleanup.append(lambda: bl.gpujob("stop", "--purge", "--detach", trial, check=False))
    else:
        cleanup.append(lambda: nomad.stop(trial))
    if arm == "nomad":
        hcl = bl.gpujob("render", spec_path)
        t0 = time.time()
        nomad.run(hcl)
    else:
        t0 = time.time()
        bl.gpujob("submit", "--detach", spec_path)
    deadline = time.monotonic() + a.timeout
    last_check = 0.0
    while True:
        names = [x for x in os.listdir(out_dir) if not x.endswith(".tmp")]
        if len(names) >= a.n:
            stamps = []
            for name in names:
                with open(os.path.join(out_dir, name)) as f:
                    text = f.read().strip()
                if not text:  # written but not yet flushed
                    break
                stamps.append(float(text))
            if len(stamps) == a.n:
                return max(stamps) - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(names)} of {a.n} processes started after {a.timeout}s")
        if time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            failed = nomad.failed_allocs(trial)
            if failed:
                raise RuntimeError(f"{len(failed)} allocation(s) failed, e.g. {failed[0].get('TaskStates')}")
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=2, help="members of the gang (1 GPU each)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"from {ARMS}")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    if a.runs < 1 or a.n < 1 or not arms or any(x not in ARMS for x in arms):
        ap.error(f"--runs >= 1, --n >= 1, --arms from {ARMS}")
    bl.exit_on_signals()
    nomad, consul = bl.Nomad(), bl.Consul()
    tag = bl.new_tag("bench-queue")
    figures = {arm: [] for arm in arms}
    with bl.scratch_dir(tag) as scratch:
        os.chmod(scratch, 0o755)
        queues_file = os.path.join(scratch, "queues.hcl")
        with open(queues_file, "w") as f:
            f.write(f'queue "default" {{\n  gpus = {a.n}\n}}\n')
        if "submit-queue" in arms:
            # The controller, once: a Nomad job that leads by a Consul lock.
            bl.gpujob("queue", "apply", queues_file)
            deadline = time.monotonic() + 120
            while not consul.leader_session():
                if time.monotonic() > deadline:
                    raise SystemExit("the queue controller did not lead within 120 s")
                time.sleep(0.2)
        try:
            for i in range(a.runs):
                for arm in bl.rotated(arms, i):
                    trial = f"{tag}-{arm}-{i}"
                    out_dir = os.path.join(scratch, trial)
                    os.makedirs(out_dir)
                    os.chmod(out_dir, 0o777)
                    spec_path = os.path.join(scratch, trial + ".hcl")
                    with open(spec_path, "w") as f:
                        f.write(spec_hcl(trial, a.n, {"BENCH_TAG": tag, "BENCH_TRIAL": trial, "BENCH_DIR": out_dir}))
                    queue_mode(consul, arm == "submit-queue", queues_file)
                    time.sleep(1)  # the watchers (submit's read, the controller) see the switch
                    figures[arm].append(bl.run_trial(
                        f"run {i + 1}/{a.runs} {arm}", trial,
                        lambda cleanup: one(nomad, a, tag, trial, arm, out_dir, spec_path, cleanup)))
        finally:
            if "submit-queue" in arms:
                nomad.stop("gpujob-queue-controller")
            consul.call("DELETE", "/v1/kv/gpujob/queues?recurse=true")

    print(f"\nAdmission latency: submit -> every process of {a.n} members running, the cluster idle "
          f"(median (min-max) of {a.runs} interleaved runs):\n")
    s = {arm: bl.summary(figures[arm]) for arm in arms}
    print("| " + " | ".join(arms) + " |")
    print("|" + " --- |" * len(arms))
    print("| " + " | ".join(bl.fmt(s[arm]) for arm in arms) + " |")
    if "nomad" in arms and "submit-queue" in arms and s["nomad"]["n"] and s["submit-queue"]["n"]:
        d = s["submit-queue"]["median"] - s["nomad"]["median"]
        print(f"\nsubmit-queue - nomad (medians): {d:+.2f} s (target <= +0.5 s: {'met' if d <= 0.5 else 'NOT met'})")
    bl.emit({"bench": "queue-latency", "runs": a.runs, "n": a.n, "raw": figures, "summary": s}, a.json)
    return 0 if bl.all_succeeded(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
