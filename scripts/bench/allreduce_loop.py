#!/usr/bin/python3
"""The recovery benchmark's workload: a torch all-reduce loop and nothing else.

It joins the process group with init_method="env://" (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, as torchrun, gpujob's supervisor or a hand launch set them), then all-reduces a
small tensor once per step, forever, and after every step appends one line

    <unix time of the step's end> <RANK> <pid> <step>

to BENCH_STEP_DIR/rank-<RANK>.log (O_APPEND: a rank's old and new process can share the
file). It checkpoints and resumes nothing: it is a pure "every rank is stepping" signal.
It ends on its own after --max-seconds, so a lost harness leaves nothing running for long.

Usage: BENCH_STEP_DIR=/tmp/x RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. \
         /usr/bin/python3 scripts/bench/allreduce_loop.py [--interval 0.05] [--max-seconds 300]
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.05,
                    help="sleep between steps (s): four ranks on two cores must not starve the "
                         "processes being timed")
    ap.add_argument("--max-seconds", type=float, default=300)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    out = os.path.join(os.environ["BENCH_STEP_DIR"], f"rank-{rank}.log")
    deadline = time.monotonic() + a.max_seconds
    dist.init_process_group("gloo", init_method="env://")
    world = dist.get_world_size()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    t = torch.ones(16)
    step = 0
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        t.fill_(1)
        step += 1
        os.write(fd, f"{time.time():.6f} {rank} {os.getpid()} {step}\n".encode())
        if step == 1:
            print(f"allreduce_loop: rank {rank} of {world} stepping", flush=True)
        time.sleep(a.interval)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
