#!/usr/bin/python3
"""The driver's overhead on training throughput: the same 2-worker training by hand and
under the gpujob driver, alternating, in one invocation.

The workload is jobspecs/workloads/bert_finetune.py (--steps 300, no checkpoints), 2 ranks
of one process each, OMP_NUM_THREADS=1, gloo on CPU:

  by hand  two processes started here with the env:// variables (RANK 0 and 1,
           WORLD_SIZE 2, MASTER_ADDR/PORT on loopback)
  driver   jobspecs/bert-finetune.nomad.hcl with workers = 2 (two members of one rank
           each) on the dev cluster scripts/bench/with-dev-cluster.sh started

The figure is rank 0's samples/s from its gpujob-result line (training time only: process
start, rendezvous and evaluation are outside it). Run i runs both, hand first on even i,
driver first on odd i. Prints each side's median (min-max), the ratio of the medians, and
the median and range of the per-run ratios driver_i / hand_i (the spread).

    scripts/bench/overhead.sh [--runs 15]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(REPO, "jobspecs", "workloads", "bert_finetune.py")
JOBSPEC = os.path.join(REPO, "jobspecs", "bert-finetune.nomad.hcl")
WORKERS = 2
RESULT = re.compile(r"^gpujob-result: (\{.*\})\s*$", re.M)


def result_sps(text, where):
    found = RESULT.findall(text)
    if not found:
        raise RuntimeError(f"no gpujob-result line from {where}:\n{text[-1500:]}")
    return float(json.loads(found[-1])["samples_per_sec"])


def by_hand(a, tag, trial, scratch):
    env = dict(os.environ, BENCH_TAG=tag, BENCH_TRIAL=trial, OMP_NUM_THREADS="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bl.free_port()),
               WORLD_SIZE=str(WORKERS), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               GPUJOB_CHECKPOINT_DIR=os.path.join(scratch, trial))
    procs = []
    try:
        for rank in range(WORKERS):
            procs.append(subprocess.Popen([bl.PYTHON, WORKLOAD] + a.args, env=dict(env, RANK=str(rank)),
                                          stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        out, _ = procs[0].communicate(timeout=a.timeout)
        for p in procs[1:]:
            p.wait(timeout=60)
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"exit codes {[p.returncode for p in procs]}")
        return result_sps(out.decode(errors="replace"), "rank 0 by hand")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def by_driver(a, nomad, trial):
    with open(JOBSPEC) as f:
        spec = f.read()
    spec, n = re.subn(r'^job "bert-finetune"', f'job "{trial}"', spec, count=1, flags=re.M)
    if n != 1:
        raise RuntimeError(f'{JOBSPEC} no longer starts with job "bert-finetune"')
    path = os.path.join(tempfile.gettempdir(), trial + ".nomad.hcl")
    with open(path, "w") as f:
        f.write(spec)
    try:
        p = subprocess.run([nomad.bin, "job", "run", "-detach",
                            "-var", f"workers={WORKERS}", "-var", "gpus_per_worker=1",
                            "-var", f"workload={WORKLOAD}", "-var", f"args={json.dumps(a.args)}",
                            path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise RuntimeError(f"nomad job run: {p.stdout.decode(errors='replace')}")
        deadline = time.monotonic() + a.timeout
        while True:
            allocs = nomad.allocs(trial)
            done = [x for x in allocs if x["ClientStatus"] in ("complete", "failed", "lost")]
            if len(allocs) == WORKERS and len(done) == WORKERS:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {trial} not done after {a.timeout}s")
            time.sleep(0.5)
        bad = [x["Name"] + " " + x["ClientStatus"] for x in allocs if x["ClientStatus"] != "complete"]
        if bad:
            raise RuntimeError(f"allocations ended badly: {bad}")
        text = ""
        for x in allocs:
            text += subprocess.run([nomad.bin, "alloc", "logs", x["ID"], "train"],
                                   stdout=subprocess.PIPE).stdout.decode(errors="replace")
        return result_sps(text, f"job {trial}")
    finally:
        nomad.stop(trial)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=600, help="per training run")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    if a.runs < 1 or a.steps < 1:
        ap.error("--runs and --steps must be >= 1")
    a.args = ["--steps", str(a.steps), "--checkpoint-every", "0", "--no-resume", "--log-every", "50"]
    bl.exit_on_signals()
    nomad = bl.Nomad()
    tag = bl.new_tag("bench-overhead")
    hand, driver = [], []
    with bl.scratch_dir(tag) as scratch:
        for i in range(a.runs):
            sides = [("hand", hand), ("driver", driver)]
            for name, out in bl.rotated(sides, i):
                trial = f"{tag}-{name}-{i}"
                try:
                    v = by_hand(a, tag, trial, scratch) if name == "hand" else by_driver(a, nomad, trial)
                    bl.log(f"run {i + 1}/{a.runs} {name}: {v:.0f} samples/s")
                except Exception as e:
                    v = None
                    bl.log(f"run {i + 1}/{a.runs} {name}: FAILED: {type(e).__name__}: {e}")
                out.append(v)

    h, d = bl.summary(hand), bl.summary(driver)
    ratios = [dv / hv for hv, dv in zip(hand, driver) if hv and dv]
    r = bl.summary(ratios)
    print(f"\nOverhead: {WORKERS}-worker bert_finetune.py --steps {a.steps}, rank 0's samples/s "
          f"(median (min-max) of {a.runs} alternating runs):\n")
    print("| by hand | under the driver | ratio of medians (driver / hand) | per-run ratio driver / hand |")
    print("| --- | --- | --- | --- |")
    rom = f"{d['median'] / h['median']:.3f}" if h["n"] and d["n"] else "-"
    print(f"| {bl.fmt(h, 'samples/s', 0)} | {bl.fmt(d, 'samples/s', 0)} | {rom} | "
          f"{bl.fmt(r, '', 3).replace(' (', '(', 1) if r['n'] else '-'} |")
    if r["n"]:
        print(f"\ntarget (ratio >= 0.98): {'met' if r['median'] >= 0.98 else 'NOT met'} "
              f"(median per-run ratio {r['median']:.3f})")
    out = {"bench": "overhead", "runs": a.runs, "hand": hand, "driver": driver, "ratios": ratios,
           "summary": {"hand": h, "driver": d, "ratio": r}}
    bl.emit(out, a.json)
    return 0 if h["n"] and d["n"] else 1


if __name__ == "__main__":
    sys.exit(main())
