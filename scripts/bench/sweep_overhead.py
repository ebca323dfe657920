#!/usr/bin/python3
"""Trial overhead: N one-GPU trials of `sleep 1`, P at a time, gpujob sweep vs `nomad job dispatch` by hand.

The two arms run interleaved in one invocation.

Both arms run the same task: the gpujob driver, one worker with one GPU (nvidia/gpu, count 1),
the rank `/bin/sh -c 'sleep 1; echo "gpujob-result: {\"loss\": $X, \"steps\": 1}"'`.

  sweep     `gpujob sweep submit` of a sweep spec (random search over one param x, written to X;
            max_trials = N, parallel = P): its controller job runs the trials as the Nomad jobs
            <sweep>-trial-001 ... The figure's clock starts just before the submit; the CLI
            returns once the sweep has completed.
  dispatch  the anchor. A parameterized batch job made from the sweep's own rendered trial job
            (`gpujob sweep render`: same group, restart/reschedule, task, driver config and
            resources), with X = ${NOMAD_META_x} and without the driver's sweep/trial fields (no
            sweep to report to), registered with `nomad job run`; then dispatch-loop.sh, a shell
            loop that keeps P of N `nomad job dispatch` children in flight and waits on them
            with blocking queries (no poll interval). The clock starts before `nomad job run`.

Every figure comes from Nomad's task states, what `nomad alloc status` shows a user: for each
of the N jobs (one allocation each, its task "train" must have completed), the task's StartedAt
(s) and FinishedAt (f). Per run and arm, with s_1 <= ... <= s_N and f_1 <= ... <= f_N sorted
separately and P = parallel:

  slot gap    the median over k = 1 .. N-P of s_(P+k) - f_k. At most P tasks run at once, so
              when the (P+k)-th task starts at least k have finished: the k-th finish freed the
              slot (GPU) the (P+k)-th start took, and the gap is how long that slot sat idle,
              trial exit -> next trial running. (Pairing by order, not by GPU: with P = GPUs and
              identical tasks it is the same, and it needs no device IDs.) Never negative unless
              more than P ran at once.
  GPU-busy    sum over the N tasks of (f - s) / (P x makespan): the share of the P slots' time
              that a task was running (it counts the gpujob supervisor's own start and exit
              inside each task as busy, in both arms alike).
  makespan    f_N - s_1.
  to job      the part of the slot gap before Nomad has the next job: the median over k of
              r_(P+k) - f_k, with r_1 <= ... <= r_N the jobs' SubmitTime (registration or
              dispatch); the rest of the gap is Nomad placing and starting the allocation.
  to first    from just before the arm's first command to s_1 (controller start for the sweep,
              job registration + first dispatch for the loop).
  task time   the median of f - s over the N tasks.

Each arm's run ends with everything it made purged (`gpujob sweep stop --purge`; the parent, then
its dispatched children, as `nomad job stop -purge` does), and the next starts only once none of
its jobs and no process of it (BENCH_TRIAL) is left.
Run i measures both arms in an order rotated by i (sweep first on even i). Prints each figure's
median (min-max) over the runs per arm, and one JSON line with every raw figure.

    scripts/bench/sweep-overhead.sh [--runs 5] [--trials 40] [--parallel 4]
    scripts/bench/sweep-overhead.sh --dev-env /tmp/gpujob-dev/env --runs 1 --trials 12
"""
import argparse
import calendar
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GPUJOB = os.path.join(REPO, "bin", "gpujob")
LOOP = os.path.join(HERE, "dispatch-loop.sh")
ARMS = ["sweep", "dispatch"]
TASK = "train"
RANK = 'sleep 1; echo "gpujob-result: {\\"loss\\": $X, \\"steps\\": 1}"'


def sweep_spec(name, trials, parallel, env):
    """The sweep spec of the sweep arm; env (BENCH_TAG/BENCH_TRIAL) goes to the rank too."""
    envs = "\n".join(f"      {k} = {bl.hcl_str(v)}" for k, v in env.items())
    return f"""sweep "{name}" {{
  train {{
    workers         = 1
    gpus_per_worker = 1
    command         = "/bin/sh"
    args            = ["-c", {bl.hcl_str(RANK)}]
    env = {{
      X = param.x
{envs}
    }}
    resources {{
      cpu    = 100
      memory = 64
    }}
  }}
  param "x" {{
    uniform = [0, 1]
  }}
  objective {{
    metric = "loss"
    mode   = "min"
  }}
  search {{
    algorithm = "random"
    seed      = 1
  }}
  max_trials        = {trials}
  parallel          = {parallel}
  max_failed_trials = 0
}}
"""


def sub_once(pattern, repl, text, count=1):
    """re.sub that insists on exactly count matches (the rendered job changed otherwise)."""
    out, n = re.subn(pattern, repl, text, flags=re.M)
    if n != count:
        raise RuntimeError(f"rendered trial job: {n} matches of {pattern!r}, want {count}")
    return out


def parent_hcl(trial_hcl, parent):
    """The dispatch arm's parameterized job from the sweep's rendered first trial job."""
    hcl = sub_once(r'^job "[^"]+" \{$',
                   f'job "{parent}" {{\n  parameterized {{\n    meta_required = ["x"]\n  }}\n', trial_hcl)
    hcl = sub_once(r'^\s+gpujob_(sweep|trial)\s+= .*\n', "", hcl, 2)  # job meta
    hcl = sub_once(r'^\s+(sweep|trial)\s+= ".*"\n', "", hcl, 2)  # the driver's config
    return sub_once(r'^(\s+X\s+= )"[^"]*"$', r'\1"${NOMAD_META_x}"', hcl)


def render_trial(spec_path, controller):
    out = subprocess.run([GPUJOB, "sweep", "render", "--controller-binary", controller, spec_path],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gpujob sweep render: {out.stdout}")
    m = re.search(r"^# The first trial, .*\n", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"gpujob sweep render printed no first trial:\n{out.stdout}")
    return out.stdout[m.end():]


def rfc3339(ts):
    """Seconds since the epoch of Nomad's RFC 3339 time with nanoseconds."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", ts)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {ts!r}")
    t = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + float(m.group(2) or 0)
    if m.group(3) != "Z":
        sign = 1 if m.group(3)[0] == "+" else -1
        t -= sign * (int(m.group(3)[1:3]) * 3600 + int(m.group(3)[4:6]) * 60)
    return t


def task_spans(nomad, prefix, n, timeout=30):
    """[(SubmitTime, StartedAt, FinishedAt)] of each of the n jobs whose ID starts with
    prefix (its task's, from Nomad's allocations); waits up to timeout for every task to be
    dead."""
    deadline = time.monotonic() + timeout
    while True:
        allocs = [a for a in nomad.get("/v1/allocations?task_states=true")
                  if a["JobID"].startswith(prefix)]
        jobs = {}
        for a in allocs:
            jobs.setdefault(a["JobID"], []).append(a)
        states = [(a["JobID"], a["ClientStatus"], (a.get("TaskStates") or {}).get(TASK) or {}) for a in allocs]
        done = len(jobs) == n and all(st.get("State") == "dead" for _, _, st in states)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if len(jobs) != n:
        raise RuntimeError(f"{len(jobs)} jobs with allocations under {prefix}, want {n}")
    more = [j for j, a in jobs.items() if len(a) != 1]
    bad = [(j, cs, st.get("State"), st.get("Failed")) for j, cs, st in states
           if cs != "complete" or st.get("State") != "dead" or st.get("Failed")]
    if more or bad:
        raise RuntimeError(f"jobs with more than one allocation: {more}; tasks not completed: {bad[:5]}")
    submitted = {j["ID"]: j["SubmitTime"] / 1e9 for j in
                 nomad.get(f"/v1/jobs?prefix={urllib.parse.quote(prefix, safe='')}")}
    return [(submitted[j], rfc3339(st["StartedAt"]), rfc3339(st["FinishedAt"])) for j, _, st in states]


def figures(tasks, parallel, t0):
    """The run's figures (see the module's docstring) from its jobs' (registered, start, finish)."""
    spans = [(s, f) for _, s, f in tasks]
    registered = sorted(r for r, _, _ in tasks)
    starts = sorted(s for s, _ in spans)
    finishes = sorted(f for _, f in spans)
    gaps = [starts[parallel + k] - finishes[k] for k in range(len(spans) - parallel)]
    to_job = [registered[parallel + k] - finishes[k] for k in range(len(spans) - parallel)]
    makespan = finishes[-1] - starts[0]
    return {"slot_gap": statistics.median(gaps),
            "to_job": statistics.median(to_job),
            "busy": sum(f - s for s, f in spans) / (parallel * makespan),
            "makespan": makespan,
            "to_first": starts[0] - t0,
            "task_time": statistics.median(f - s for s, f in spans),
            "gaps": [round(g, 4) for g in gaps], "to_jobs": [round(g, 4) for g in to_job]}


class Bench:
    def __init__(self, a, tag, scratch):
        self.a, self.tag, self.scratch = a, tag, scratch
        self.nomad = bl.Nomad()
        self.controller = os.environ.get("GPUJOB_CONTROLLER_BINARY") or GPUJOB
        self.details = {arm: [] for arm in ARMS}

    def env(self, trial):
        return {"BENCH_TAG": self.tag, "BENCH_TRIAL": trial}

    def spec(self, name, trial):
        path = os.path.join(self.scratch, name + ".hcl")
        with open(path, "w") as f:
            f.write(sweep_spec(name, self.a.trials, self.a.parallel, self.env(trial)))
        return path

    def sh(self, argv, trial, logname, timeout):
        """Runs argv with the trial's tags, its output into scratch/logname; raises on failure."""
        path = os.path.join(self.scratch, logname)
        with open(path, "w") as out:
            # A process group of its own: on a timeout the loop's nomad and curl die with it,
            # so no dispatch lands after the purge.
            p = subprocess.Popen(argv, env=dict(os.environ, **self.env(trial)), stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except BaseException as e:
                rc = f"timeout ({timeout} s)" if isinstance(e, subprocess.TimeoutExpired) else None
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                if rc is None:
                    raise
        if rc != 0:
            with open(path) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"{shlex.join(argv)}: {rc}:\n{tail}")

    def delete(self, job):
        """`nomad job stop -purge job`; a job already gone is success."""
        q = urllib.parse.quote(job, safe="")
        req = urllib.request.Request(f"{self.nomad.addr}/v1/job/{q}?purge=true", method="DELETE")
        try:
            with urllib.request.urlopen(req, timeout=60):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    def jobs(self, prefix):
        q = urllib.parse.quote(prefix, safe="")
        return [j["ID"] for j in self.nomad.get(f"/v1/jobs?prefix={q}")]

    def purge_sweep(self, name):
        try:
            p = subprocess.run([GPUJOB, "sweep", "stop", "--purge", name], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=180)
            if p.returncode != 0:
                bl.log(f"gpujob sweep stop --purge {name}: {p.stdout.strip()}")
        except subprocess.TimeoutExpired:
            bl.log(f"gpujob sweep stop --purge {name}: no answer in 180 s")
        self.await_no_jobs(name + "-")  # its controller and trials

    def purge_dispatch(self, parent):
        # The parent first: no dispatch can add a child after that.
        if parent in self.jobs(parent):
            self.delete(parent)
        self.await_no_jobs(parent + "/", purge=True)

    def await_no_jobs(self, prefix, purge=False, timeout=60):
        """Waits until no job's ID starts with prefix; with purge, purges the ones there."""
        deadline = time.monotonic() + timeout
        while left := self.jobs(prefix):
            if time.monotonic() > deadline:
                bl.log(f"jobs {prefix}* still there {timeout} s after the purge: {left}")
                return
            if purge:
                for job in left:
                    self.delete(job)
            time.sleep(0.2)

    def record(self, arm, label, fig):
        self.details[arm].append(fig)
        if fig is not None:
            bl.log(f"{label}: slot gap {fig['slot_gap']:.3f} s (to job {fig['to_job']:.3f} s), "
                   f"GPU-busy {fig['busy']:.3f}, makespan {fig['makespan']:.2f} s, to first {fig['to_first']:.2f} s, "
                   f"task {fig['task_time']:.2f} s")
        return fig["slot_gap"] if fig else None

    def sweep(self, i, trial, cleanup):
        name = f"{self.tag}-sweep-{i}"
        path = self.spec(name, trial)
        cleanup.append(lambda: self.purge_sweep(name))
        t0 = time.time()
        self.sh([GPUJOB, "sweep", "submit", "--controller-binary", self.controller, path], trial,
                name + ".log", self.a.timeout)
        tasks = task_spans(self.nomad, name + "-trial-", self.a.trials)
        return figures(tasks, self.a.parallel, t0)

    def dispatch(self, i, trial, cleanup):
        parent = f"{self.tag}-dispatch-{i}"
        hcl = parent_hcl(render_trial(self.spec(parent, trial), self.controller), parent)
        with open(os.path.join(self.scratch, parent + ".nomad.hcl"), "w") as f:
            f.write(hcl)
        cleanup.append(lambda: self.purge_dispatch(parent))
        t0 = time.time()
        self.nomad.run(hcl)
        self.sh([LOOP, parent, str(self.a.trials), str(self.a.parallel)], trial, parent + ".log", self.a.timeout)
        tasks = task_spans(self.nomad, parent + "/dispatch-", self.a.trials)
        return figures(tasks, self.a.parallel, t0)

    def one(self, arm, i):
        trial = f"{self.tag}-{arm}-{i}"
        label = f"run {i + 1}/{self.a.runs} {arm}"
        fig = {}

        def measure(cleanup):
            fig.update(getattr(self, arm)(i, trial, cleanup))
            return fig["slot_gap"]

        bl.run_trial(label, trial, measure)
        return self.record(arm, label, fig or None)


def cell(s, unit, digits):
    if s["n"] == 0:
        return bl.fmt(s)
    return bl.fmt(s, unit, digits) if unit else bl.fmt(s, "", digits).replace("  (", " (")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trials", type=int, default=40, help="trials (jobs) per run and arm")
    ap.add_argument("--parallel", type=int, default=4, help="trials in flight at once (the dev cluster has 4 GPUs)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one arm of one run may take")
    ap.add_argument("--dev-env", metavar="FILE",
                    help="(sweep-overhead.sh) use the running dev cluster of this env file instead of starting one")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if a.runs < 1 or a.parallel < 1 or a.trials <= a.parallel:
        ap.error("--runs >= 1, --parallel >= 1, --trials > --parallel")
    if not os.access(GPUJOB, os.X_OK):
        ap.error(f"no {GPUJOB}: run make build first")
    bl.exit_on_signals()
    gpus = sum(len(d.get("Instances") or []) for n in bl.Nomad().get("/v1/nodes?resources=true")
               if n["Status"] == "ready" for d in (n.get("NodeResources") or {}).get("Devices") or []
               if d.get("Vendor") == "nvidia" and d.get("Type") == "gpu")
    if gpus < a.parallel:
        ap.error(f"the cluster's ready nodes have {gpus} GPU(s): --parallel {a.parallel} needs as many")
    tag = bl.new_tag("bench-so")
    others = [x["JobID"] for x in bl.Nomad().get("/v1/allocations")
            if x["ClientStatus"] in ("pending", "running")]
    if others:
        bl.log(f"other allocations run on the cluster (their GPUs and CPU skew the figures): {sorted(set(others))}")
    with bl.scratch_dir(tag) as scratch:
        os.chmod(scratch, 0o755)
        b = Bench(a, tag, scratch)
        for i in range(a.runs):
            for arm in bl.rotated(ARMS, i):
                b.one(arm, i)

    rows = [("slot gap: trial exit -> next trial running (median of a run's gaps)", "slot_gap", "s", 2),
            ("of it: trial exit -> next job registered (median)", "to_job", "s", 2),
            ("GPU-busy fraction: task time / (parallel x makespan)", "busy", "", 2),
            ("makespan: first start -> last finish", "makespan", "s", 1),
            ("first command -> first task running", "to_first", "s", 2),
            ("task time: StartedAt -> FinishedAt (median)", "task_time", "s", 2)]
    targets = {"slot_gap": lambda v: f"<= 1 s: {'met' if v <= 1 else 'NOT met'}",
               "busy": lambda v: f">= 0.8: {'met' if v >= 0.8 else 'NOT met'}"}
    cmd = shlex.join(["scripts/bench/sweep-overhead.sh"] + sys.argv[1:])
    print(f"\n`{cmd}` ({time.strftime('%Y-%m-%d')}): trial overhead, {a.trials} one-GPU trials of `sleep 1`, "
          f"{a.parallel} at a time, from Nomad's task states (median (min-max) of {a.runs} interleaved runs):\n")
    print("| figure | gpujob sweep | `nomad job dispatch` loop | sweep - loop (medians) | target (sweep) |")
    print("| --- | --- | --- | --- | --- |")
    summaries = {}
    for title, key, unit, digits in rows:
        s = {arm: bl.summary([d[key] if d else None for d in b.details[arm]]) for arm in ARMS}
        summaries[key] = s
        diff = target = "-"
        if s["sweep"]["n"] and s["dispatch"]["n"]:
            d = s["sweep"]["median"] - s["dispatch"]["median"]
            diff = f"{d:+.{digits}f}" + (f" {unit}" if unit else "")
        if s["sweep"]["n"] and key in targets:
            target = targets[key](s["sweep"]["median"])
        print(f"| {title} | {cell(s['sweep'], unit, digits)} | {cell(s['dispatch'], unit, digits)} | {diff} | {target} |")
    out = {"bench": "sweep-overhead", "command": cmd, "runs": a.runs, "trials": a.trials, "parallel": a.parallel,
           "cluster": a.dev_env or "own (with-dev-cluster.sh)", "raw": b.details, "summary": summaries}
    bl.emit(out, a.json)
    return 0 if all(summaries["slot_gap"][arm]["n"] for arm in ARMS) else 1


if __name__ == "__main__":
    sys.exit(main())
