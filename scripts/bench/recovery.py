#!/usr/bin/python3
"""Failure -> all ranks stepping again: gpujob vs torchrun vs a fresh launch, interleaved.

The workload is scripts/bench/allreduce_loop.py (init_method="env://", one all-reduce per
step, a timestamped line per step and rank), 2 members x 2 processes = 4 ranks. Each run
measures every column once, in an order rotated by the run number:

  gpujob    a Nomad job (driver "gpujob", count = 2, nproc_per_node = 2) on the dev cluster
            that scripts/bench/with-dev-cluster.sh started; once all 4 ranks step, kill -9 of
            one rank; the figure is kill -> the last of the 4 ranks' first step in a new
            process.
  preload   the same job with preload = ["torch", "torch.distributed"]: the ranks of every
            round are forked from interpreters that imported torch once (a warm restart).
  torchrun  python3 -m torch.distributed.run, c10d rendezvous on loopback, 2 agents x 2
            processes, --max-restarts 3 (torch 1.13 on Python 3.11 needs --redirects 1
            --tee 1); the same kill and the same figure. torchrun's own defaults otherwise
            (--monitor-interval 5 s), unless --torchrun-monitor-interval says else.
  floor     the same 4 processes launched fresh by hand with the env:// variables; the
            figure is launch -> the last rank's first step: what any restart costs at least
            (interpreter, torch import, process group, first collective).

"New process" is decided by PID from the step lines, so a survivor finishing a step just
after the kill does not count as recovered.

Prints per column the median and range over --runs runs, and the two target checks.
Run it through the wrapper (which starts and stops the dev cluster):

    scripts/bench/recovery.sh [--runs 5] [--columns gpujob,torchrun,floor]
"""
import argparse
import os
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "allreduce_loop.py")
NNODES, NPROC = 2, 2
WORLD = NNODES * NPROC
COLUMNS = ["gpujob", "preload", "torchrun", "floor"]


class Steps:
    """Reads the workload's step lines (BENCH_STEP_DIR/rank-R.log) as they grow."""

    def __init__(self, d):
        self.dir = d
        self.offset = {r: 0 for r in range(WORLD)}
        self.first = {r: {} for r in range(WORLD)}  # rank -> pid -> time of its first step
        self.latest = {}  # rank -> pid of its latest line

    def poll(self):
        for r in range(WORLD):
            try:
                with open(os.path.join(self.dir, f"rank-{r}.log"), "rb") as f:
                    f.seek(self.offset[r])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # leave a half-written line for the next poll
            self.offset[r] += end
            for line in data[:end].splitlines():
                ts, rank, pid, _step = line.split()
                pid = int(pid)
                self.first[r].setdefault(pid, float(ts))
                self.latest[r] = pid

    def wait_stepping(self, old_pids, timeout):
        """Waits until every rank has stepped in a process not in old_pids; returns
        {rank: (pid, time of that process's first step)}."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            got = {}
            for r in range(WORLD):
                new = [(ts, pid) for pid, ts in self.first[r].items() if pid not in old_pids]
                if new:
                    ts, pid = min(new)
                    got[r] = (pid, ts)
            if len(got) == WORLD:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {timeout}s only ranks {sorted(got)} stepping")
            time.sleep(0.02)


def trial_env(tag, trial, step_dir):
    env = dict(os.environ, BENCH_TAG=tag, BENCH_TRIAL=trial, BENCH_STEP_DIR=step_dir)
    env.pop("PYTHONPATH", None)
    return env


def kill_one_rank(steps, rank, settle):
    """Once all ranks step: wait settle seconds, kill -9 the rank's current process;
    returns (kill time, the PIDs of the generation that was running)."""
    time.sleep(settle)
    steps.poll()
    old = {pid for r in range(WORLD) for pid in steps.first[r]}
    victim = steps.latest[rank]
    t_kill = time.time()
    os.kill(victim, signal.SIGKILL)
    return t_kill, old


def workload_args(a):
    return [WORKLOAD, "--interval", str(a.interval), "--max-seconds", str(a.max_seconds)]


def gpujob_hcl(job, a, env, preload=False):
    args = ", ".join(bl.hcl_str(x) for x in workload_args(a))
    config = f"""        command        = "{bl.PYTHON}"
        args           = [{args}]
        nproc_per_node = {NPROC}
        max_restarts   = 3{chr(10) + '        preload        = ["torch", "torch.distributed"]' if preload else ""}
        rendezvous {{
          nnodes       = "{NNODES}"
          port         = "rdzv"
          join_timeout = "2m"
        }}"""
    env = {k: env[k] for k in ("BENCH_TAG", "BENCH_TRIAL", "BENCH_STEP_DIR")}
    return bl.one_shot_job_hcl(job, "train", "train", NNODES, "gpujob", config, env,
                               cpu=500, memory=2048)


def recovery_time(step_dir, a):
    """Once every rank steps: the kill of --kill-rank, then the seconds from it to the
    last rank's first step in a new process."""
    steps = Steps(step_dir)
    steps.wait_stepping(set(), a.start_timeout)
    t_kill, old = kill_one_rank(steps, a.kill_rank, a.settle)
    got = steps.wait_stepping(old, a.recover_timeout)
    return max(ts for _, ts in got.values()) - t_kill


def run_gpujob(a, tag, trial, step_dir, cleanup, preload=False):
    nomad = bl.Nomad()
    job = trial
    cleanup.append(lambda: nomad.stop(job))
    nomad.run(gpujob_hcl(job, a, trial_env(tag, trial, step_dir), preload))
    return recovery_time(step_dir, a)


def run_preload(a, tag, trial, step_dir, cleanup):
    return run_gpujob(a, tag, trial, step_dir, cleanup, preload=True)


def run_torchrun(a, tag, trial, step_dir, cleanup):
    env = trial_env(tag, trial, step_dir)
    port = bl.free_port()
    agents = []
    cleanup.append(lambda: stop_procs(agents))
    for node in range(NNODES):
        logs = os.path.join(step_dir, f"agent-{node}")
        os.makedirs(logs)
        cmd = [bl.PYTHON, "-m", "torch.distributed.run",
               "--nnodes", str(NNODES), "--nproc_per_node", str(NPROC),
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
               "--rdzv_id", trial, "--max_restarts", "3",
               "--redirects", "1", "--tee", "1", "--log_dir", logs]
        if a.torchrun_monitor_interval is not None:
            cmd += ["--monitor_interval", str(a.torchrun_monitor_interval)]
        with open(os.path.join(step_dir, f"agent-{node}.out"), "wb") as out:
            agents.append(subprocess.Popen(cmd + workload_args(a), env=env, stdout=out,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True))
    return recovery_time(step_dir, a)


def run_floor(a, tag, trial, step_dir, cleanup):
    env = trial_env(tag, trial, step_dir)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bl.free_port()),
               WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(NPROC), OMP_NUM_THREADS="1")
    procs = []
    cleanup.append(lambda: stop_procs(procs))
    t0 = time.time()
    for rank in range(WORLD):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank % NPROC),
                 GROUP_RANK=str(rank // NPROC))
        procs.append(subprocess.Popen([bl.PYTHON] + workload_args(a), env=e,
                                      stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
    got = Steps(step_dir).wait_stepping(set(), a.start_timeout)
    return max(ts for _, ts in got.values()) - t0


def stop_procs(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


RUNNERS = {"gpujob": run_gpujob, "preload": run_preload, "torchrun": run_torchrun, "floor": run_floor}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--columns", default=",".join(COLUMNS))
    ap.add_argument("--kill-rank", type=int, default=3, help="global rank to kill -9")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds of stepping before the kill")
    ap.add_argument("--interval", type=float, default=0.05, help="workload's sleep per step")
    ap.add_argument("--max-seconds", type=float, default=240, help="workload's own lifetime")
    ap.add_argument("--start-timeout", type=float, default=120)
    ap.add_argument("--recover-timeout", type=float, default=90)
    ap.add_argument("--torchrun-monitor-interval", type=float, default=None,
                    help="torchrun's --monitor_interval (default: torchrun's own, 5 s in 1.13)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    cols = [c for c in a.columns.split(",") if c]
    if not cols or any(c not in RUNNERS for c in cols) or a.runs < 1:
        ap.error(f"--columns: a comma list of {COLUMNS}; --runs >= 1")
    if not 0 <= a.kill_rank < WORLD:
        ap.error(f"--kill-rank must be 0..{WORLD - 1}")
    bl.exit_on_signals()
    tag = bl.new_tag("bench-recovery")
    figures = {c: [] for c in cols}
    with bl.scratch_dir(tag) as scratch:
        os.chmod(scratch, 0o755)
        for i in range(a.runs):
            for col in bl.rotated(cols, i):
                trial = f"{tag}-{col}-{i}"
                step_dir = os.path.join(scratch, trial)
                os.makedirs(step_dir)
                os.chmod(step_dir, 0o777)  # the Nomad task may run as another user
                v = bl.run_trial(
                    f"run {i + 1}/{a.runs} {col}", trial,
                    lambda cleanup: RUNNERS[col](a, tag, trial, step_dir, cleanup))
                figures[col].append(v)
    report(a, cols, figures)
    return 0 if bl.all_succeeded(figures) else 1


def report(a, cols, figures):
    s = {c: bl.summary(figures[c]) for c in cols}
    names = {"gpujob": "gpujob (kill -9 -> all 4 step)", "preload": "gpujob, preload (same)",
             "torchrun": "torchrun c10d (same)",
             "floor": "floor: fresh launch -> all 4 step"}
    mi = a.torchrun_monitor_interval
    print(f"\nFailure -> all {WORLD} ranks stepping again ({NNODES} members x {NPROC} processes, "
          f"kill -9 of rank {a.kill_rank}; median (min-max) of {a.runs} interleaved runs"
          f"{'; torchrun --monitor_interval ' + str(mi) if mi is not None else ''}):\n")
    print("| " + " | ".join(names[c] for c in cols) + " |")
    print("|" + " --- |" * len(cols))
    print("| " + " | ".join(bl.fmt(s[c]) for c in cols) + " |")
    g, p, t, f = (s.get(c, {"n": 0}) for c in COLUMNS)
    if p["n"] and f["n"]:
        print(f"\npreload: median {p['median']:.2f} s, floor {f['median']:.2f} s (target: below the floor "
              f"and under 1.5 s: {'met' if p['median'] < f['median'] and p['median'] < 1.5 else 'NOT met'})")
    if g["n"] and f["n"]:
        d = g["median"] - f["median"]
        print(f"\ngpujob - floor (medians): {d:+.2f} s  (target <= +0.5 s: "
              f"{'met' if d <= 0.5 else 'NOT met'})")
    if g["n"] and t["n"]:
        r = t["median"] / g["median"]
        print(f"torchrun / gpujob (medians): {r:.2f}x  (target >= 1.5x: "
              f"{'met' if r >= 1.5 else 'NOT met'})")
    out = {"bench": "recovery", "runs": a.runs, "kill_rank": a.kill_rank,
           "torchrun_monitor_interval": mi, "raw": figures, "summary": s}
    bl.emit(out, a.json)


if __name__ == "__main__":
    sys.exit(main())
