#!/usr/bin/python3
"""Summarise bert_finetune.py logs: per-step spread of the per-rank loss, and the result line.

Reads log text (any mix of ranks, any prefixes before "gpujob:") from files or stdin and prints
one JSON object: {"steps": N, "max_spread": x, "max_spread_step": s, "spread_by_step": {...},
"ranks": [...], "result": {...}}. --limit X exits 1 when a step's spread exceeds X.
Usage: scripts/bench/loss_spread.py [--limit 0.05] [--skip-steps 0] [LOG ...]
"""
import argparse
import fileinput
import json
import re
import sys

STEP = re.compile(r"gpujob: step=(\d+) epoch=(\d+) rank=(\d+) loss=([0-9.eE+-]+|nan|inf)")
RESULT = re.compile(r"gpujob-result: (\{.*\})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=None)
    ap.add_argument("--skip-steps", type=int, default=0, help="ignore steps <= this (e.g. warm-up)")
    ap.add_argument("logs", nargs="*")
    a = ap.parse_args()
    by_step, result, ranks = {}, None, set()
    for line in fileinput.input(a.logs or ["-"]):
        m = STEP.search(line)
        if m:
            step, rank, loss = int(m.group(1)), int(m.group(3)), float(m.group(4))
            # a restarted group logs some steps twice: keep the latest value per (step, rank)
            by_step.setdefault(step, {})[rank] = loss
            ranks.add(rank)
            continue
        m = RESULT.search(line)
        if m:
            result = json.loads(m.group(1))
    spreads = {s: max(v.values()) - min(v.values()) for s, v in sorted(by_step.items())
               if len(v) > 1 and s > a.skip_steps}
    worst = max(spreads.items(), key=lambda kv: kv[1]) if spreads else (None, 0.0)
    out = {"steps": len(by_step), "ranks": sorted(ranks), "max_spread": round(worst[1], 4),
           "max_spread_step": worst[0],
           "mean_spread": round(sum(spreads.values()) / len(spreads), 4) if spreads else 0.0,
           "spread_by_step": {str(s): round(v, 4) for s, v in spreads.items()}, "result": result}
    print(json.dumps(out))
    if a.limit is not None and worst[1] > a.limit:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
