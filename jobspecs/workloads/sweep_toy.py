#!/usr/bin/python3
"""A small, fast PyTorch workload for hyperparameter-sweep tests and benchmarks.

A one-hidden-layer tanh network (NTK scaling, so the learning-rate landscape hardly moves
with --width) fits a noisy synthetic regression with plain SGD for --steps steps (a fraction
of a second of compute on a CPU). Its score is the held-out R^2 against the clean targets:
0 at the start (the output layer starts at zero), 1 for a perfect fit. With the defaults
(100 steps, width 32) the learning rate has clearly bad regions and a clear optimum:
  lr <= 1e-3      barely learns (score < 0.04)
  lr 0.1 .. 0.25  the good region (0.88 .. 0.93), best at about 0.2 for every seed
  lr 0.28 .. 0.34 the edge: erratic (0.26 .. 0.91 by seed)
  lr >= 0.35      diverges within 30 steps (score -1, the floor)
Narrow networks (--width 1..4) are clearly worse away from lr 0.2 (0.59 at lr 0.1, against
0.88 at width 32) and less stable near the edge; width 128 is a little better. Everything is
deterministic: the data from --data-seed, initialisation and batch order from --seed.

Launched like bert_finetune.py (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; gloo when WORLD_SIZE > 1, single process otherwise). Every rank
computes the gradient of its slice of the global batch; the gradients are averaged, so any
world size follows the same trajectory up to floating-point summation order.

Output lines (stdout, flushed):
  gpujob: resumed from checkpoint step=S file=PATH rank=R restart_count=N
  gpujob: step=S epoch=0 rank=R loss=L global_loss=G samples_per_sec=X   (every rank)
  gpujob-metric: {"step": S, "score": R2, "loss": MSE}                   (rank 0)
  gpujob-result: {"score": ..., "loss": ..., "steps": S, ...}             (rank 0, last line)
See README.md next to this file.
"""
import time

T_PROCESS_START = time.time()

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

PROG = "sweep_toy"
LOSS_CAP = 1e6  # a diverged run reports this loss (JSON has no inf or NaN)
SCORE_FLOOR = -1.0  # and this score


def fail(msg, code=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def _int(lo):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}: {s!r}")
        return v
    return parse


def _float(positive):
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {s!r}")
        if not math.isfinite(v) or v < 0 or (positive and v == 0):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if positive else '>='} 0: {s!r}")
        return v
    return parse


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Fast, deterministic sweep test workload (DDP-style).")
    ap.add_argument("--lr", type=_float(True), default=0.1, help="SGD learning rate (search it on a log scale)")
    ap.add_argument("--width", type=_int(1), default=32, help="hidden units")
    ap.add_argument("--steps", type=_int(0), default=100, help="optimizer steps in total")
    ap.add_argument("--batch", type=_int(1), default=64,
                    help="global batch, split evenly over the ranks (must divide by WORLD_SIZE)")
    ap.add_argument("--seed", type=_int(0), default=1, help="initialisation and batch order")
    ap.add_argument("--data-seed", type=_int(0), default=0, help="the task (same for every trial by default)")
    ap.add_argument("--noise", type=_float(False), default=0.5, help="label noise (std) of the training targets")
    ap.add_argument("--report-every", type=_int(0), default=10,
                    help="steps between gpujob-metric lines; 0: only the final one")
    ap.add_argument("--log-every", type=_int(0), default=None,
                    help="steps between gpujob: step= lines; 0: none (default: --report-every)")
    ap.add_argument("--checkpoint-every", type=_int(0),
                    default=_int(0)(os.environ.get("GPUJOB_CHECKPOINT_EVERY") or "10"),
                    help="steps; 0 disables (default: $GPUJOB_CHECKPOINT_EVERY, else 10)")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("GPUJOB_CHECKPOINT_DIR", ""),
                    help="default $GPUJOB_CHECKPOINT_DIR; empty disables checkpoints")
    ap.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    ap.add_argument("--sleep-per-step", type=_float(False), default=0.0,
                    help="seconds to sleep after each step (stretches a trial for fault tests)")
    ap.add_argument("--fail-if-lr-above", type=_float(False), default=None,
                    help="exit 4 at start when --lr is above this (a failing trial)")
    ap.add_argument("--fail-at-step", type=_int(1), default=None,
                    help="rank --fail-rank exits 5 on reaching this step")
    ap.add_argument("--fail-once", action="store_true",
                    help="with --fail-at-step: only the first time (a marker file in the checkpoint dir "
                         "remembers it), so a restarted trial passes the step")
    ap.add_argument("--fail-rank", type=_int(0), default=0, help="the rank that --fail-at-step stops")
    ap.add_argument("--pg-timeout", type=_int(1), default=120, help="seconds for process-group init and collectives")
    a = ap.parse_args(argv)
    if a.log_every is None:
        a.log_every = a.report_every
    if a.fail_once and a.fail_at_step is None:
        ap.error("--fail-once needs --fail-at-step")
    if a.fail_once and not a.checkpoint_dir:
        ap.error("--fail-once needs a checkpoint dir (for its marker file)")
    return a


def env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        fail(f"environment {name}={v!r} is not an integer")


# --------------------------------------------------------------------------- checkpoints
# The same scheme as bert_finetune.py: ckpt-<step>.pt, written to a temp file, fsynced,
# renamed into place, the directory fsynced; the two newest are kept.

CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")


def list_checkpoints(d):
    out = []
    for p in glob.glob(os.path.join(d, "ckpt-*.pt")):
        m = CKPT_RE.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(torch, d, state, keep=2):
    final = os.path.join(d, f"ckpt-{state['step']:09d}.pt")
    tmp = f"{final}.tmp.{socket.gethostname()}.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(d)
    for _, old in list_checkpoints(d)[:-keep]:
        try:
            os.remove(old)
        except FileNotFoundError:
            pass
    return final


def clean_stale_tmp(d, older_than=60.0):
    now = time.time()
    for p in glob.glob(os.path.join(d, "ckpt-*.pt.tmp.*")):
        try:
            if now - os.path.getmtime(p) > older_than:
                os.remove(p)
        except OSError:
            pass


def load_latest(torch, d, fingerprint):
    """Newest readable checkpoint; unreadable ones are skipped, another configuration's refused."""
    for step, path in reversed(list_checkpoints(d)):
        try:
            st = torch.load(path, map_location="cpu")
            if not isinstance(st, dict) or st.get("format") != 1 or st.get("step") != step \
                    or st.get("prog") != PROG:
                raise ValueError(f"not a {PROG} checkpoint")
        except Exception as e:
            print(f"gpujob: warning: skipping unreadable checkpoint {path}: {e}", flush=True)
            continue
        if st["fingerprint"] != fingerprint:
            diff = {k: (st["fingerprint"].get(k), v) for k, v in fingerprint.items()
                    if st["fingerprint"].get(k) != v}
            fail(f"checkpoint {path} was written with a different configuration (checkpoint vs now: {diff}); "
                 f"remove it, pass --no-resume or use another GPUJOB_CHECKPOINT_DIR")
        return st, path
    return None, None


# --------------------------------------------------------------------------- main

DIM, N_TRAIN, N_EVAL, TEACHER_UNITS = 16, 4096, 1024, 8
# out = GAIN * tanh(x W1^T / sqrt(DIM) + b1) . a / sqrt(width) + BIAS_SCALE * b. The output
# bias moves BIAS_SCALE^2 (about 3) times faster than a weight would, so it is the direction
# that diverges first: a sharp edge at lr ~ 0.33, the same for every width.
GAIN, BIAS_SCALE = 2.0, 1.7


def make_data(torch, data_seed, noise):
    """x ~ N(0, I); target = a linear part plus a tanh feature part, normalised to mean 0 and
    variance 1 over all samples; training targets get N(0, noise^2) label noise, held-out
    ones are clean (so R^2 = 1 - MSE, and a perfect fit scores 1)."""
    g = torch.Generator().manual_seed(data_seed)
    w = torch.randn(DIM, generator=g, dtype=torch.float64) / math.sqrt(DIM)
    w1 = torch.randn(DIM, TEACHER_UNITS, generator=g, dtype=torch.float64) / math.sqrt(DIM)
    w2 = torch.randn(TEACHER_UNITS, generator=g, dtype=torch.float64) / math.sqrt(TEACHER_UNITS)
    x = torch.randn(N_TRAIN + N_EVAL, DIM, generator=g, dtype=torch.float64)
    f = x @ w + 0.5 * torch.tanh(2 * x @ w1) @ w2
    f = (f - f.mean()) / f.std()
    eps = torch.randn(N_TRAIN, generator=g, dtype=torch.float64)
    x, f = x.float(), f.float()
    return x[:N_TRAIN], f[:N_TRAIN] + noise * eps.float(), x[N_TRAIN:], f[N_TRAIN:]


def main(argv):
    args = parse_args(argv)
    rank = env_int("RANK", 0)
    world = env_int("WORLD_SIZE", 1)
    local_rank = env_int("LOCAL_RANK", 0)
    restart_count = env_int("TORCHELASTIC_RESTART_COUNT", env_int("GPUJOB_RESTART_COUNT", 0))
    if world < 1:
        fail(f"WORLD_SIZE={world} must be >= 1")
    if not 0 <= rank < world:
        fail(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    if local_rank < 0:
        fail(f"LOCAL_RANK={local_rank} must be >= 0")
    if args.batch % world:
        fail(f"--batch {args.batch} is not divisible by WORLD_SIZE={world}")
    if world > 1:
        for k in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(k):
                fail(f"WORLD_SIZE={world} needs {k} in the environment (init_method=env://)")
    if args.fail_if_lr_above is not None and args.lr > args.fail_if_lr_above:
        fail(f"--lr {args.lr:g} is above --fail-if-lr-above {args.fail_if_lr_above:g} (test hook)", code=4)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, env_int("OMP_NUM_THREADS", 1)))
    distributed = world > 1
    if distributed:
        try:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=args.pg_timeout))
        except Exception as e:
            fail(f"init_process_group(gloo, env://) with MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
                 f"MASTER_PORT={os.environ.get('MASTER_PORT')} rank={rank}/{world} failed: {e}", code=3)

    def log(msg):
        print(f"gpujob: {msg}", flush=True)

    x_train, y_train, x_eval, f_eval = make_data(torch, args.data_seed, args.noise)

    # NTK-scaled one-hidden-layer net (see GAIN). The output weights start at 0, so every run
    # starts at R^2 = 0 (the mean predictor) and a run that barely learns stays just above 0.
    g = torch.Generator().manual_seed(args.seed)
    params = {"w1": torch.randn(args.width, DIM, generator=g), "b1": torch.zeros(args.width),
              "a": torch.zeros(args.width), "b": torch.zeros(1)}
    names = list(params)
    for p in params.values():
        p.requires_grad_(True)

    def forward(x):
        h = torch.tanh(x @ params["w1"].t() / math.sqrt(DIM) + params["b1"])
        return GAIN * (h @ params["a"]) / math.sqrt(args.width) + BIAS_SCALE * params["b"]

    fingerprint = {k: getattr(args, k) for k in ("lr", "width", "batch", "seed", "data_seed", "noise")}

    ckdir = args.checkpoint_dir
    if ckdir and rank == 0:
        try:
            os.makedirs(ckdir, exist_ok=True)
        except OSError as e:
            fail(f"cannot create checkpoint dir {ckdir}: {e}")
        clean_stale_tmp(ckdir)
    state, path = (None, None)
    if ckdir and not args.no_resume and rank == 0:
        state, path = load_latest(torch, ckdir, fingerprint)
    if distributed:
        box = [(state, path)]
        dist.broadcast_object_list(box, src=0)
        state, path = box[0]
    start_step = 0
    if state is not None:
        with torch.no_grad():
            for k in names:
                params[k].copy_(state["params"][k])
        start_step = state["step"]
        log(f"resumed from checkpoint step={start_step} file={path} rank={rank} restart_count={restart_count}")
    del state
    if rank == 0:
        log(f"start world_size={world} backend={'gloo' if distributed else 'none'} lr={args.lr:g} "
            f"width={args.width} batch={args.batch} steps={args.steps} seed={args.seed} start_step={start_step}")

    def maybe_fail(step):
        """--fail-at-step: the failing rank exits 5 (after the step's metric and checkpoint).
        With --fail-once, only while its marker file is absent; without, also a run resumed
        past the step fails at once, so the trial fails however often it is restarted."""
        if rank != args.fail_rank:
            return
        if args.fail_once:
            marker = os.path.join(ckdir, f"failed-at-{args.fail_at_step}")
            if os.path.exists(marker):
                return
            with open(marker, "w") as f:
                f.write(f"{time.time()}\n")
        fail(f"failing at step {step} on rank {rank} (--fail-at-step {args.fail_at_step})", code=5)

    if args.fail_at_step is not None and not args.fail_once and start_step >= args.fail_at_step:
        maybe_fail(start_step)

    def checkpoint(step):
        st = {"format": 1, "prog": PROG, "fingerprint": fingerprint, "step": step, "world_size": world,
              "params": {k: params[k].detach().clone() for k in names}, "saved_at": time.time()}
        return save_checkpoint(torch, ckdir, st)

    def evaluate():
        with torch.no_grad():
            mse = torch.mean((forward(x_eval) - f_eval) ** 2).item()
        if not math.isfinite(mse) or mse > LOSS_CAP:
            return SCORE_FLOOR, LOSS_CAP
        return max(SCORE_FLOOR, 1.0 - mse / f_eval.var().item()), mse

    def report(step):
        if rank == 0:
            score, loss = evaluate()
            print("gpujob-metric: " + json.dumps({"step": step, "score": round(score, 6), "loss": round(loss, 6)}),
                  flush=True)

    # One buffer for every all-reduce, alive for the whole run: a tensor that gloo's worker
    # thread still holds when Python drops it is freed by that thread under the GIL, which
    # deadlocks at interpreter exit (torch 1.13). Layout: the gradients, then the loss.
    numel = sum(p.numel() for p in params.values())
    buf = torch.zeros(numel + 1)
    local = args.batch // world
    step = start_step
    t_train = time.time()
    win_n, win_t, win_local, win_global = 0, time.time(), 0.0, 0.0
    while step < args.steps:
        # The global batch of this step depends on (seed, step) only, so a resumed run draws
        # the same batches; this rank takes its slice.
        bg = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        idx = torch.randint(0, N_TRAIN, (args.batch,), generator=bg)[rank * local:(rank + 1) * local]
        for p in params.values():
            p.grad = None
        loss = torch.mean((forward(x_train[idx]) - y_train[idx]) ** 2)
        loss.backward()
        with torch.no_grad():
            buf[:numel].copy_(torch.cat([params[k].grad.reshape(-1) for k in names]))
            buf[numel] = loss.detach()
            if distributed:
                dist.all_reduce(buf)
                buf /= world
            off = 0
            for k in names:
                p = params[k]
                p -= args.lr * buf[off:off + p.numel()].view_as(p)
                off += p.numel()
        step += 1
        win_n += 1
        win_local += loss.item()
        win_global += buf[numel].item()
        if args.log_every and (step % args.log_every == 0 or step == args.steps):
            now = time.time()
            log(f"step={step} epoch=0 rank={rank} loss={win_local / win_n:.6g} global_loss={win_global / win_n:.6g} "
                f"samples_per_sec={win_n * args.batch / max(now - win_t, 1e-9):.1f} lr={args.lr:g} world_size={world}")
            win_n, win_t, win_local, win_global = 0, now, 0.0, 0.0
        if args.report_every and step % args.report_every == 0 and step < args.steps:
            report(step)
        if ckdir and args.checkpoint_every and step % args.checkpoint_every == 0 and rank == 0:
            checkpoint(step)
        if step == args.fail_at_step:
            maybe_fail(step)
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)
    train_seconds = time.time() - t_train
    if ckdir and rank == 0 and step > start_step and not (args.checkpoint_every and step % args.checkpoint_every == 0):
        checkpoint(step)
    report(step)
    if rank == 0:
        score, loss = evaluate()
        result = {"score": round(score, 6), "loss": round(loss, 6), "diverged": loss >= LOSS_CAP,
                  "steps": step, "steps_this_run": step - start_step, "resumed_from_step": start_step,
                  "restart_count": restart_count, "world_size": world, "lr": args.lr, "width": args.width,
                  "batch": args.batch, "seed": args.seed, "train_seconds": round(train_seconds, 3),
                  "wall_seconds": round(time.time() - T_PROCESS_START, 3)}
        print("gpujob-result: " + json.dumps(result), flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
