#!/usr/bin/python3
"""gpujob's Consul rendezvous vs torch's c10d dynamic rendezvous, interleaved, per M.

Three columns, M separate member processes each, timed from a common start barrier to the
last member's return:

  gpujob            BenchmarkRoundProcesses/M=<M> of driver/rendezvous (the test binary,
                    built once, re-executed as the members; it starts its own Consul agent)
  torch c10d        scripts/bench/torch_rdzv.py --m <M> (torch 1.13, as shipped: it polls
                    the store state once a second)
  torch c10d 50ms   the same with --sync-poll 0.05: torch's 1 s poll patched to 50 ms in the
                    member processes, so the ratio to it is the protocol's, not the poll's

Each run measures every M in every column once, in an order rotated by the run number.
Prints per M each column's median (min-max) and the ratios of the medians.

    scripts/bench/rdzv-compare.sh [--runs 5] [--m 8,32,64]
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COLUMNS = ["gpujob", "torch", "torch-50ms"]
FAST_POLL = 0.05
BENCH_MS = (8, 32, 64)  # the sub-benchmarks BenchmarkRoundProcesses has


def ours(test_bin, m, env):
    p = subprocess.run([test_bin, "-test.run", "^$", "-test.bench", f"^BenchmarkRoundProcesses$/^M={m}$",
                        "-test.benchtime", "1x"], cwd=os.path.join(REPO, "driver", "rendezvous"),
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = p.stdout.decode(errors="replace")
    found = re.search(rf"^BenchmarkRoundProcesses/M={m}\S*\s.*?([0-9.eE+-]+) s/round", out, re.M)
    if p.returncode != 0 or not found:
        raise RuntimeError(f"BenchmarkRoundProcesses M={m} (exit {p.returncode}):\n{out[-2000:]}")
    return float(found.group(1))


def torch(m, sync_poll, env):
    cmd = [bl.PYTHON, os.path.join(HERE, "torch_rdzv.py"), "--m", str(m)]
    if sync_poll is not None:
        cmd += ["--sync-poll", str(sync_poll)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=900)
    lines = [json.loads(line) for line in p.stdout.decode().splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines or "seconds" not in lines[-1]:
        raise RuntimeError(f"torch_rdzv.py M={m}: {lines or p.stderr.decode(errors='replace')[-2000:]}")
    return float(lines[-1]["seconds"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--m", default=",".join(map(str, BENCH_MS)), help="member counts")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    ms = [int(x) for x in a.m.split(",") if x]
    if a.runs < 1 or not ms or any(m not in BENCH_MS for m in ms):
        ap.error(f"--runs >= 1; --m from {BENCH_MS} (BenchmarkRoundProcesses's sub-benchmarks)")
    bl.exit_on_signals()
    tag = bl.new_tag("bench-rdzv")
    env = dict(os.environ, BENCH_TAG=tag)
    figures = {(c, m): [] for m in ms for c in COLUMNS}
    with bl.scratch_dir(tag) as scratch:
        test_bin = os.path.join(scratch, "rendezvous.test")
        bl.log("building the rendezvous test binary")
        subprocess.run(["go", "test", "-c", "-o", test_bin, "./driver/rendezvous/"], cwd=REPO,
                       check=True)
        run = {"gpujob": lambda m: ours(test_bin, m, env),
               "torch": lambda m: torch(m, None, env),
               "torch-50ms": lambda m: torch(m, FAST_POLL, env)}
        for i in range(a.runs):
            for m in ms:
                for col in bl.rotated(COLUMNS, i):
                    try:
                        v = run[col](m)
                        bl.log(f"run {i + 1}/{a.runs} M={m} {col}: {v:.3f} s")
                    except Exception as e:
                        v = None
                        bl.log(f"run {i + 1}/{a.runs} M={m} {col}: FAILED: {e}")
                    figures[(col, m)].append(v)

    print(f"\nRendezvous, M member processes, barrier -> last member returned "
          f"(median (min-max) of {a.runs} interleaved runs):\n")
    print("| M | gpujob (Consul) | torch c10d (1 s poll) | torch c10d (poll patched to 50 ms) "
          "| ratio torch / gpujob | ratio torch-50ms / gpujob |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = []
    for m in ms:
        s = {c: bl.summary(figures[(c, m)]) for c in COLUMNS}
        cells = [bl.fmt(s[c], digits=3) for c in COLUMNS]
        for c in ("torch", "torch-50ms"):
            ok = s["gpujob"]["n"] and s[c]["n"]
            cells.append(f"{s[c]['median'] / s['gpujob']['median']:.1f}x" if ok else "-")
        print(f"| {m} | " + " | ".join(cells) + " |")
        rows.append({"m": m, "raw": {c: figures[(c, m)] for c in COLUMNS}, "summary": s})
    out = {"bench": "rdzv-compare", "runs": a.runs, "fast_poll": FAST_POLL, "rows": rows}
    bl.emit(out, a.json)
    return 0 if bl.all_succeeded(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
