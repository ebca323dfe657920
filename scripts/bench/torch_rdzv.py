#!/usr/bin/python3
"""Time torch.distributed.elastic's dynamic rendezvous (c10d backend) with M processes.

For the side-by-side with gpujob's Consul rendezvous (BENCHMARKS.md). For each M:

  1. the parent hosts the c10d TCPStore on 127.0.0.1:<free port> (the role torchrun's
     rendezvous host plays; --child-hosts lets the children settle it among themselves
     as torchrun agents on one machine do);
  2. M separate processes start (fork by default: torch is imported once, so starting 64 of
     them on 2 cores does not take minutes; --start-method spawn for a cold import each),
     each reports "ready" and waits on a common start barrier;
  3. the barrier opens; each process builds the handler with
     registry.get_rendezvous_handler(RendezvousParameters(backend="c10d", ...,
     min_nodes=M, max_nodes=M)) and calls next_rendezvous();
  4. seconds = (last process's return) - (barrier opening), CLOCK_MONOTONIC being
     system-wide on Linux.

--sync-poll S replaces, inside each member process only (nothing on disk changes), the fixed
1 s with which torch 1.13's dynamic rendezvous polls the store for state changes by S seconds.
That 1 s is two constants: the sleep between polls (_delay(seconds=1) in
_DistributedRendezvousOpExecutor.run) and the state holder's read cache, which answers a sync
from memory while the last read is under 1 s old (_BackendRendezvousStateHolder's
cache_duration=1); patching only the sleep would leave the polls served from a stale cache.
This separates the protocol's cost from its polling: with S = 0.05 what is left is the store
round trips and the compare-and-set retries.

Output: one JSON line per M on stdout, e.g. {"m": 8, "seconds": 1.4, ...}.
Every child is terminated (then killed) on exit, error or Ctrl-C.

Usage: /usr/bin/python3 scripts/bench/torch_rdzv.py --m 8 32 64 [--sync-poll 0.05]
"""
import argparse
import json
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import time
import uuid
from datetime import timedelta


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patch_sync_poll(seconds):
    """Makes torch's rendezvous poll the store every `seconds` instead of every second:
    the sleep between polls and the lifetime of the cached state both."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    orig = dr._delay

    def delay(seconds_arg):
        # Only the state-sync poll asks for exactly 1 s; the random (0, 0.3) s back-off
        # before a rendezvous stays torch's.
        if not isinstance(seconds_arg, tuple) and seconds_arg == 1:
            seconds_arg = seconds
        orig(seconds=seconds_arg)

    dr._delay = lambda seconds: delay(seconds)  # torch calls it as _delay(seconds=...)

    holder_init = dr._BackendRendezvousStateHolder.__init__

    def init(self, backend, settings, cache_duration=1):
        holder_init(self, backend, settings, cache_duration=cache_duration)
        self._cache_duration = seconds

    dr._BackendRendezvousStateHolder.__init__ = init


def member(idx, endpoint, run_id, m, is_host, join_timeout, sync_poll, start_evt, done_evt,
           results):
    # Children die with the parent even if it is killed with SIGKILL.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    try:
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        if sync_poll is not None:
            patch_sync_poll(sync_poll)
        results.put(("ready", idx, None))
        start_evt.wait()
        t_start = time.monotonic()
        extra = {"join_timeout": join_timeout, "last_call_timeout": 1, "read_timeout": 60}
        if is_host is not None:
            extra["is_host"] = is_host
        params = RendezvousParameters(
            backend="c10d", endpoint=endpoint, run_id=run_id,
            min_nodes=m, max_nodes=m, **extra)
        handler = get_rendezvous_handler(params)
        t_handler = time.monotonic()
        _store, rank, world = handler.next_rendezvous()
        t_done = time.monotonic()
        results.put(("done", idx, {"rank": rank, "world": world, "start": t_start,
                                    "handler": t_handler, "end": t_done}))
        # Stay alive until everyone has finished: a member may host the store (--child-hosts)
        # and the others still read from it.
        done_evt.wait(join_timeout + 60)
    except BaseException as e:  # report, never hang the parent
        results.put(("error", idx, f"{type(e).__name__}: {e}"))


def run_one(m, args):
    ctx = mp.get_context(args.start_method)
    start_evt, done_evt, results = ctx.Event(), ctx.Event(), ctx.Queue()
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    run_id = f"bench-{m}-{uuid.uuid4().hex[:8]}"
    server = None
    if not args.child_hosts:
        from torch.distributed import TCPStore

        server = TCPStore("127.0.0.1", port, is_master=True,
                          timeout=timedelta(seconds=args.join_timeout + 60), wait_for_workers=False)
    is_host = None if args.child_hosts else False
    procs = [ctx.Process(target=member, daemon=True,
                         args=(i, endpoint, run_id, m, is_host, args.join_timeout,
                               args.sync_poll, start_evt, done_evt, results)) for i in range(m)]
    try:
        t_spawn = time.monotonic()
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.join_timeout + 120
        ready = 0
        while ready < m:
            kind, idx, val = results.get(timeout=max(1, deadline - time.monotonic()))
            if kind == "error":
                raise RuntimeError(f"member {idx}: {val}")
            ready += 1
        t_ready = time.monotonic()
        t0 = time.monotonic()
        start_evt.set()
        done = []
        while len(done) < m:
            kind, idx, val = results.get(timeout=max(1, deadline - time.monotonic()))
            if kind == "error":
                raise RuntimeError(f"member {idx}: {val}")
            done.append(val)
        ranks = sorted(d["rank"] for d in done)
        if ranks != list(range(m)) or any(d["world"] != m for d in done):
            raise RuntimeError(f"bad rendezvous result: ranks={ranks}")
        last = max(d["end"] for d in done)
        first = min(d["end"] for d in done)
        handler_max = max(d["handler"] - t0 for d in done)
        return {"m": m, "seconds": round(last - t0, 3),
                "first_seconds": round(first - t0, 3),
                "handler_seconds": round(handler_max, 3),
                "startup_seconds": round(t_ready - t_spawn, 3),
                "start_method": args.start_method,
                "sync_poll": args.sync_poll if args.sync_poll is not None else 1.0,
                "store_host": "child" if args.child_hosts else "parent",
                "torch": __import__("torch").__version__}
    finally:
        done_evt.set()
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        del server


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[8, 32, 64], help="member counts")
    ap.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default="fork")
    ap.add_argument("--child-hosts", action="store_true",
                    help="let the members settle who hosts the store (torchrun agents on one host)")
    ap.add_argument("--join-timeout", type=int, default=300)
    ap.add_argument("--sync-poll", type=float, default=None,
                    help="seconds between store polls instead of torch's fixed 1 s (patched "
                         "in the member processes)")
    args = ap.parse_args()
    if any(m < 1 for m in args.m):
        ap.error("--m values must be >= 1")
    # Import torch in the parent before forking, so children share it.
    import torch.distributed.elastic.rendezvous.registry  # noqa: F401

    rc = 0
    for m in args.m:
        try:
            print(json.dumps(run_one(m, args)), flush=True)
        except (RuntimeError, queue.Empty) as e:
            print(json.dumps({"m": m, "error": str(e) or type(e).__name__}), flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
