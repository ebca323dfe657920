#!/usr/bin/python3
"""gpujob's rendezvous at scale: an in-memory Consul dev agent vs a 3-server Consul with its data on disk.

Two columns, M in-process members (BenchmarkRound of driver/rendezvous: the test binary, built
once), timed from nothing (sessions included) to every member holding the complete round:

  dev agent      the single in-memory `consul agent -dev` the test binary starts itself
  3 servers      the dev cluster's 3-server raft (data dirs on disk) behind its Consul client
                 agent, as on a real cluster; $CONSUL_HTTP_ADDR (run under with-dev-cluster.sh
                 with GPUJOB_DEV_CONSUL_SERVERS=3)

Each run measures both columns once, in an order rotated by the run number; every invocation
covers M = 8, 64, 256, 1024. Prints per M each column's median (min-max) and the requests per
member.

  --baseline REV adds a third column: the 3 servers again, with the rendezvous as of git revision
  REV (built from a worktree of it), interleaved with the others: a change measured against the
  code it replaced, in the same run.

    scripts/bench/rdzv-scale.sh [--runs 5] [--baseline REV]
"""
import argparse
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COLUMNS = ["dev agent", "3 servers"]
MS = (8, 64, 256, 1024)  # BenchmarkRound's sub-benchmarks
LINE = re.compile(r"^BenchmarkRound/M=(\d+)\S*\s+\d+\s+(\d+) ns/op\s+([0-9.]+) req/member", re.M)


def bench(test_bin, env):
    """One BenchmarkRound invocation: {M: (seconds, requests per member)}."""
    p = subprocess.run([test_bin, "-test.run", "^$", "-test.bench", "^BenchmarkRound$",
                        "-test.benchtime", "1x"], cwd=os.path.join(REPO, "driver", "rendezvous"),
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    out = p.stdout.decode(errors="replace")
    found = {int(m): (int(ns) / 1e9, float(req)) for m, ns, req in LINE.findall(out)}
    if p.returncode != 0 or set(found) != set(MS):
        raise RuntimeError(f"BenchmarkRound (exit {p.returncode}):\n{out[-2000:]}")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--baseline", metavar="REV", help="also measure the rendezvous of git revision REV on the 3 servers")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs >= 1")
    addr = os.environ.get("CONSUL_HTTP_ADDR", "")
    if not addr:
        ap.error("CONSUL_HTTP_ADDR (the 3-server cluster's client agent) is not set: run rdzv-scale.sh")
    bl.exit_on_signals()
    tag = bl.new_tag("bench-rdzv-scale")
    base = {k: v for k, v in os.environ.items() if k != "GPUJOB_BENCH_CONSUL_ADDR"}
    servers = dict(base, BENCH_TAG=tag, GPUJOB_BENCH_CONSUL_ADDR=addr.removeprefix("http://"))
    envs = {"dev agent": dict(base, BENCH_TAG=tag), "3 servers": servers}
    columns = list(COLUMNS)
    if a.baseline:
        rev = subprocess.run(["git", "rev-parse", "--short", a.baseline + "^{commit}"], cwd=REPO, check=True,
                             stdout=subprocess.PIPE, text=True).stdout.strip()
        baseline_col = f"3 servers, {rev}"
        columns.append(baseline_col)
        envs[baseline_col] = servers
    secs = {(c, m): [] for c in columns for m in MS}
    reqs = {(c, m): [] for c in columns for m in MS}
    with bl.scratch_dir(tag) as scratch:
        test_bin = os.path.join(scratch, "rendezvous.test")
        bl.log("building the rendezvous test binary")
        subprocess.run(["go", "test", "-c", "-o", test_bin, "./driver/rendezvous/"], cwd=REPO, check=True)
        bins = {c: test_bin for c in columns}
        if a.baseline:
            tree = os.path.join(scratch, "baseline")
            bl.log(f"building the rendezvous test binary of {rev}")
            subprocess.run(["git", "worktree", "add", "--detach", tree, rev], cwd=REPO, check=True,
                           stdout=subprocess.DEVNULL)
            try:
                bins[baseline_col] = os.path.join(scratch, "rendezvous-baseline.test")
                subprocess.run(["go", "test", "-c", "-o", bins[baseline_col], "./driver/rendezvous/"], cwd=tree,
                               check=True)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, check=False)
        for i in range(a.runs):
            for col in bl.rotated(columns, i):
                try:
                    got = bench(bins[col], envs[col])
                    bl.log(f"run {i + 1}/{a.runs} {col}: " +
                           ", ".join(f"M={m} {got[m][0]:.3f} s" for m in MS))
                except Exception as e:
                    got = {}
                    bl.log(f"run {i + 1}/{a.runs} {col}: FAILED: {e}")
                for m in MS:
                    secs[(col, m)].append(got[m][0] if m in got else None)
                    reqs[(col, m)].append(got[m][1] if m in got else None)

    print(f"\nRendezvous scale, M in-process members, nothing -> every member holds the round "
          f"(median (min-max) of {a.runs} interleaved runs):\n")
    extra = f" | 3 servers, the rendezvous of {columns[2].split(', ')[1]}" if a.baseline else ""
    print("| M | dev agent (in memory) | 3 servers, data on disk, via a client agent" + extra +
          f" | requests per member ({' / '.join(columns)}) |")
    print("| --- " * (len(columns) + 2) + "|")
    rows = []
    for m in MS:
        s = {c: bl.summary(secs[(c, m)]) for c in columns}
        r = {c: bl.summary(reqs[(c, m)]) for c in columns}
        per = " / ".join(f"{r[c]['median']:.1f}" if r[c]["n"] else "-" for c in columns)
        print(f"| {m} | " + " | ".join(bl.fmt(s[c], digits=3) for c in columns) + f" | {per} |")
        rows.append({"m": m, "raw": {c: secs[(c, m)] for c in columns},
                     "requests_per_member": {c: reqs[(c, m)] for c in columns}, "summary": s})
    s = bl.summary(secs[("3 servers", 1024)])
    if s["n"]:
        met = "met" if s["median"] < 3 else "NOT met"
        print(f"\n3 servers, M=1024 (median): {s['median']:.2f} s  (target < 3 s: {met})")
    bl.emit({"bench": "rdzv-scale", "runs": a.runs, "rows": rows}, a.json)
    return 0 if bl.all_succeeded(secs) else 1


if __name__ == "__main__":
    sys.exit(main())
