#!/usr/bin/python3
"""BERT-style text-classification fine-tune for gpujob (DDP, torchrun-compatible launch).

A small Transformer encoder classifier with its own word-level tokenizer, trained on a
sentiment-like corpus that this script generates deterministically (nothing is downloaded).
Launched like torchrun launches scripts: it reads RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (and
GPUJOB_CHECKPOINT_DIR) from the environment; WORLD_SIZE unset or 1 runs single-process.

Output lines (stdout, flushed):
  gpujob: resumed from checkpoint step=S epoch=E file=PATH rank=R
  gpujob: step=S epoch=E rank=R loss=L global_loss=G samples_per_sec=X lr=...
  gpujob-metric: {"step": S, "accuracy": A, "f1": F, "loss": L}   (rank 0 only: held-out evaluation)
  gpujob-result: {"accuracy": ..., "f1": ..., ...}          (rank 0 only, last line)
See README.md next to this file.
"""
import time

T_PROCESS_START = time.time()

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from collections import Counter, deque  # noqa: E402
from datetime import timedelta  # noqa: E402

PROG = "bert_finetune"


def fail(msg, code=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------- arguments

def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {s!r}")
    return v


def nonneg_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {s!r}")
    return v


def nonneg_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}")
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {s!r}")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog=PROG, description="BERT-style fine-tune on a generated sentiment corpus (DDP).")
    ap.add_argument("--epochs", type=positive_int, default=5)
    ap.add_argument("--steps", type=nonneg_int, default=0,
                    help="max optimizer steps in total (0: epochs x steps per epoch)")
    ap.add_argument("--global-batch", type=positive_int, default=32,
                    help="samples per optimizer step over all ranks; split evenly (must divide by WORLD_SIZE)")
    ap.add_argument("--train-size", type=positive_int, default=4096)
    ap.add_argument("--eval-size", type=positive_int, default=2000)
    ap.add_argument("--eval-label-noise", type=nonneg_float, default=0.03,
                    help="fraction of held-out labels flipped (annotation noise; caps accuracy near 1-x)")
    ap.add_argument("--seq-len", type=positive_int, default=32)
    ap.add_argument("--d-model", type=positive_int, default=64)
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--ff", type=positive_int, default=128, help="feed-forward width")
    ap.add_argument("--layers", type=positive_int, default=2)
    ap.add_argument("--dropout", type=nonneg_float, default=0.0,
                    help="0 keeps 1- and N-worker runs on the same trajectory")
    ap.add_argument("--lr", type=nonneg_float, default=2e-3)
    ap.add_argument("--warmup", type=nonneg_float, default=0.1, help="warm-up fraction of the steps")
    ap.add_argument("--seed", type=nonneg_int, default=1234)
    ap.add_argument("--checkpoint-every", type=nonneg_int,
                    default=nonneg_int(os.environ.get("GPUJOB_CHECKPOINT_EVERY", "20")),
                    help="steps; 0 disables (default: $GPUJOB_CHECKPOINT_EVERY, else 20)")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("GPUJOB_CHECKPOINT_DIR", ""),
                    help="default $GPUJOB_CHECKPOINT_DIR; empty disables checkpoints")
    ap.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints")
    ap.add_argument("--eval-every", type=nonneg_int, default=None,
                    help="steps between held-out evaluations, each a gpujob-metric line of rank 0; "
                         "0: only the final one (default: --checkpoint-every)")
    ap.add_argument("--eval-metric-size", type=nonneg_int, default=256,
                    help="held-out samples a periodic evaluation scores (the first N of the split; "
                         "0: all of it); the final evaluation always scores all of it")
    ap.add_argument("--log-every", type=positive_int, default=10)
    ap.add_argument("--loss-window", type=positive_int, default=200,
                    help="logged loss = mean of this rank's last N step losses (smooths shard noise)")
    ap.add_argument("--sleep-per-step", type=nonneg_float, default=0.0,
                    help="seconds to sleep after each step (test hook)")
    ap.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    ap.add_argument("--cpu", action="store_true", help="train on CPU even when CUDA is available")
    ap.add_argument("--pg-timeout", type=positive_int, default=300,
                    help="seconds for process-group init and collectives")
    a = ap.parse_args(argv)
    if a.eval_every is None:
        a.eval_every = a.checkpoint_every
    if a.d_model % a.heads:
        ap.error(f"--d-model {a.d_model} is not divisible by --heads {a.heads}")
    if a.seq_len < 8:
        ap.error("--seq-len must be >= 8")
    if a.eval_label_noise >= 0.5:
        ap.error("--eval-label-noise must be < 0.5")
    if a.global_batch > a.train_size:
        ap.error(f"--global-batch {a.global_batch} is larger than --train-size {a.train_size}")
    return a


def env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        fail(f"environment {name}={v!r} is not an integer")


# --------------------------------------------------------------------------- corpus

POS_ADJ = ["good", "great", "excellent", "wonderful", "delightful", "superb", "charming", "brilliant",
           "enjoyable", "moving", "fantastic", "lovely", "gripping", "clever", "beautiful", "fresh",
           "memorable", "touching", "funny", "stunning", "solid", "engaging", "smart", "warm"]
NEG_ADJ = ["bad", "terrible", "awful", "boring", "dull", "mediocre", "disappointing", "tedious",
           "clumsy", "weak", "bland", "messy", "forgettable", "lifeless", "predictable", "annoying",
           "painful", "shallow", "flat", "stale", "silly", "confusing", "ugly", "cold"]
INTENS = ["very", "really", "truly", "quite", "rather", "extremely", "so", "pretty", "fairly"]
SUBJ = ["the movie", "this film", "the plot", "the acting", "the soundtrack", "the story", "the cast",
        "the ending", "the script", "the dialogue", "the pacing", "the direction", "the camera work",
        "the lead", "the sequel", "this show", "the first act", "the finale", "the score", "the effects"]
VERB = ["is", "was", "felt", "seemed", "looked", "sounded", "turned out"]
OPEN = ["honestly ,", "overall ,", "to be fair ,", "in the end ,", "i think", "frankly ,", "well ,",
        "for me ,", "all in all ,", "sadly ,", "luckily ,", "as expected ,"]
CLOSE = [".", "!", ". would watch again", ". ten minutes too long", ". saw it on friday",
         ". my friends agreed", ". not much else to say", ". the popcorn was fine", "..."]
NAMES = ["".join(p) for p in zip(["ka", "lo", "mi", "ra", "te", "vu", "zo", "ne", "pi", "su"] * 4,
                                  ["ren", "vik", "dor", "lan", "mos", "tal", "bek", "sar", "fin", "gul"] * 4)]


P_NEGATION = 0.2  # share of clauses negated ("not <adjective of the other polarity>")
P_CONTRAST = 0.25  # share of sentences "<opposite clause> , but <clause>"


def _clause(rng, label):
    adj = rng.choice(POS_ADJ if label else NEG_ADJ)
    subj = rng.choice(SUBJ)
    if rng.random() < 0.2:
        subj = f"{subj} by {rng.choice(NAMES)}{rng.randrange(100)}"  # rare tokens, often OOV in eval
    verb = rng.choice(VERB)
    r = rng.random()
    if r < P_NEGATION:  # negation: "not <adj of the other polarity>"
        adj = rng.choice(NEG_ADJ if label else POS_ADJ)
        return f"{subj} {verb} not {rng.choice(INTENS) + ' ' if rng.random() < 0.3 else ''}{adj}"
    if r < P_NEGATION + 0.3:
        return f"{subj} {verb} {rng.choice(INTENS)} {adj}"
    return f"{subj} {verb} {adj}"


def make_sentence(rng, label):
    parts = []
    if rng.random() < 0.35:
        parts.append(rng.choice(OPEN))
    if rng.random() < P_CONTRAST:  # contrast: the clause after "but" decides
        parts.append(_clause(rng, 1 - label) + " , but")
    parts.append(_clause(rng, label))
    if rng.random() < 0.5:
        parts.append(rng.choice(CLOSE))
    return " ".join(parts)


def make_corpus(seed, train_size, eval_size, eval_noise):
    """Deterministic (seeded) balanced corpus; only the held-out labels carry noise."""
    rng = random.Random(seed)
    train = [(make_sentence(rng, i % 2), i % 2) for i in range(train_size)]
    rng.shuffle(train)
    erng = random.Random(seed + 1_000_003)
    evals = []
    for i in range(eval_size):
        label = i % 2
        text = make_sentence(erng, label)
        if erng.random() < eval_noise:
            label = 1 - label
        evals.append((text, label))
    return train, evals


class WordTokenizer:
    """Deterministic word-level vocabulary built from the training split."""
    PAD, UNK, CLS, SEP = 0, 1, 2, 3
    SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    _re = re.compile(r"[a-z0-9']+|[.,!?]")

    def __init__(self, texts):
        counts = Counter(w for t in texts for w in self.split(t))
        words = sorted(counts, key=lambda w: (-counts[w], w))
        self.itos = self.SPECIALS + words
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def split(cls, text):
        return cls._re.findall(text.lower())

    def encode(self, text, seq_len):
        ids = [self.CLS] + [self.stoi.get(w, self.UNK) for w in self.split(text)][: seq_len - 2] + [self.SEP]
        return ids + [self.PAD] * (seq_len - len(ids))

    def __len__(self):
        return len(self.itos)


# --------------------------------------------------------------------------- checkpoints

CKPT_GLOB = "ckpt-*.pt"
CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")


def list_checkpoints(d):
    out = []
    for p in glob.glob(os.path.join(d, CKPT_GLOB)):
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
    """Atomic: write a temp file, fsync, rename over the final name, fsync the directory.
    A reader never sees a partial ckpt-*.pt; a kill leaves at most a stale *.tmp.* file."""
    step = state["step"]
    final = os.path.join(d, f"ckpt-{step:09d}.pt")
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
    """Newest readable checkpoint whose configuration matches; unreadable ones are skipped."""
    for step, path in reversed(list_checkpoints(d)):
        try:
            st = torch.load(path, map_location="cpu")
            if not isinstance(st, dict) or st.get("format") != 1 or st.get("step") != step:
                raise ValueError("not a bert_finetune checkpoint")
        except Exception as e:  # truncated/corrupt file: fall back to the previous one
            print(f"gpujob: warning: skipping unreadable checkpoint {path}: {e}", flush=True)
            continue
        if st["fingerprint"] != fingerprint:
            diff = {k: (st["fingerprint"].get(k), v) for k, v in fingerprint.items()
                    if st["fingerprint"].get(k) != v}
            fail(f"checkpoint {path} was written with a different configuration "
                 f"(checkpoint vs now: {diff}); remove it, pass --no-resume or use another "
                 f"GPUJOB_CHECKPOINT_DIR")
        return st, path
    return None, None


# --------------------------------------------------------------------------- main

def main(argv):
    args = parse_args(argv)

    rank = env_int("RANK", 0)
    world = env_int("WORLD_SIZE", 1)
    local_rank = env_int("LOCAL_RANK", 0)
    local_world = env_int("LOCAL_WORLD_SIZE", 1)
    restart_count = env_int("TORCHELASTIC_RESTART_COUNT", env_int("GPUJOB_RESTART_COUNT", 0))
    if world < 1:
        fail(f"WORLD_SIZE={world} must be >= 1")
    if not 0 <= rank < world:
        fail(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    if local_rank < 0 or local_world < 1 or local_rank >= local_world:
        fail(f"LOCAL_RANK={local_rank} is outside [0, LOCAL_WORLD_SIZE={local_world})")
    if args.global_batch % world:
        fail(f"--global-batch {args.global_batch} is not divisible by WORLD_SIZE={world}")
    local_batch = args.global_batch // world
    if world > 1:
        for k in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(k):
                fail(f"WORLD_SIZE={world} needs {k} in the environment (init_method=env://)")

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    omp = os.environ.get("OMP_NUM_THREADS")
    if omp:
        try:
            torch.set_num_threads(max(1, int(omp)))
        except ValueError:
            fail(f"OMP_NUM_THREADS={omp!r} is not an integer")
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))

    use_cuda = torch.cuda.is_available() and not args.cpu
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        fail("--backend nccl needs CUDA")

    distributed = world > 1
    if distributed:
        try:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=args.pg_timeout))
        except Exception as e:
            fail(f"init_process_group({backend}, env://) with MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
                 f"MASTER_PORT={os.environ.get('MASTER_PORT')} rank={rank}/{world} failed: {e}", code=3)

    def log(msg):
        print(f"gpujob: {msg}", flush=True)

    # ---- data (identical on every rank: same seed)
    train, evals = make_corpus(args.seed, args.train_size, args.eval_size, args.eval_label_noise)
    tok = WordTokenizer(t for t, _ in train)
    x_train = torch.tensor([tok.encode(t, args.seq_len) for t, _ in train], dtype=torch.long)
    y_train = torch.tensor([y for _, y in train], dtype=torch.long)
    x_eval = torch.tensor([tok.encode(t, args.seq_len) for t, _ in evals], dtype=torch.long)
    y_eval = torch.tensor([y for _, y in evals], dtype=torch.long)

    # Same global batches for any WORLD_SIZE: with drop_last the sampler gives rank r the
    # positions r, r+W, r+2W, ... of one seeded permutation, so local batch k of all ranks
    # together is exactly permutation[k*B:(k+1)*B], the 1-worker batch k.
    sampler = DistributedSampler(range(args.train_size), num_replicas=world, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = args.train_size // args.global_batch
    total_steps = args.epochs * steps_per_epoch
    if args.steps:
        total_steps = min(total_steps, args.steps)

    # ---- model (same init on every rank; DDP also broadcasts rank 0's parameters)
    class EncoderClassifier(nn.Module):
        def __init__(self, vocab, seq_len, d_model, heads, ff, layers, dropout, classes=2):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model, padding_idx=WordTokenizer.PAD)
            self.pos = nn.Embedding(seq_len, d_model)
            self.emb_norm = nn.LayerNorm(d_model)
            self.drop = nn.Dropout(dropout)
            layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.pool = nn.Linear(d_model, d_model)
            self.head = nn.Linear(d_model, classes)
            self.register_buffer("positions", torch.arange(seq_len), persistent=False)

        def forward(self, ids):
            pad = ids.eq(WordTokenizer.PAD)
            h = self.tok(ids) + self.pos(self.positions[: ids.size(1)])
            h = self.drop(self.emb_norm(h))
            h = self.encoder(h, src_key_padding_mask=pad)
            cls = torch.tanh(self.pool(h[:, 0]))  # [CLS] pooling
            return self.head(self.drop(cls))

    torch.manual_seed(args.seed)
    model = EncoderClassifier(len(tok), args.seq_len, args.d_model, args.heads, args.ff,
                              args.layers, args.dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warm = max(1, int(args.warmup * total_steps))

    def lr_lambda(s):  # BERT-style linear warm-up then linear decay
        return (s + 1) / warm if s < warm else max(0.0, (total_steps - s) / max(1, total_steps - warm))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    fingerprint = {k: getattr(args, k) for k in (
        "seed", "train_size", "global_batch", "seq_len", "d_model", "heads", "ff", "layers",
        "dropout", "lr", "warmup")}
    fingerprint["vocab"] = len(tok)

    # ---- resume: rank 0 picks the newest readable checkpoint and broadcasts it, so all ranks
    # resume from the same step even when the directory is not shared between nodes.
    ckdir = args.checkpoint_dir
    if ckdir:
        if rank == 0:
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
    start_step, start_epoch, start_k = 0, 0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start_step, start_epoch, start_k = state["step"], state["epoch"], state["step_in_epoch"]
        log(f"resumed from checkpoint step={start_step} epoch={start_epoch} file={path} rank={rank} "
            f"restart_count={restart_count}")
    del state
    if ckdir and args.checkpoint_every == 0 and rank == 0:
        log("checkpoints disabled (--checkpoint-every 0)")
    if not ckdir and rank == 0:
        log("no GPUJOB_CHECKPOINT_DIR: checkpoints disabled")

    ddp = DDP(model, device_ids=[device.index] if use_cuda else None) if distributed else model
    if rank == 0:
        log(f"start world_size={world} backend={backend if distributed else 'none'} device={device} "
            f"global_batch={args.global_batch} local_batch={local_batch} steps={total_steps} "
            f"steps_per_epoch={steps_per_epoch} vocab={len(tok)} params="
            f"{sum(p.numel() for p in model.parameters())} threads={torch.get_num_threads()} "
            f"start_step={start_step}")

    def checkpoint(step, epoch, k):
        if k >= steps_per_epoch:
            epoch, k = epoch + 1, 0
        st = {"format": 1, "fingerprint": fingerprint, "step": step, "epoch": epoch,
              "step_in_epoch": k, "world_size": world, "model": model.state_dict(),
              "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
              "sampler": {"seed": args.seed, "epoch": epoch, "batches_done": k,
                          "global_batch": args.global_batch},
              # dropout RNG is re-derived from (seed, rank, step) at every step, so the
              # state below is informational; data order is fully given by "sampler".
              "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
              "saved_at": time.time()}
        return save_checkpoint(torch, ckdir, st)

    # ---- held-out evaluation: every rank scores a shard; the confusion counts and the summed
    # cross-entropy are all-reduced, so every rank computes the same figures.
    def eval_batches(n, fast):
        """This rank's shard of the first n held-out samples (0: all) in batches of 256. fast:
        sorted by length in batches of 64, each cut to its longest row (padding is masked out,
        so the predictions are the same at about half the cost)."""
        xs, ys = (x_eval[:n], y_eval[:n]) if n else (x_eval, y_eval)
        xs, ys = xs[rank::world], ys[rank::world]
        bs = 256
        if fast:
            order = torch.sort(xs.ne(WordTokenizer.PAD).sum(1), stable=True).indices
            xs, ys, bs = xs[order], ys[order], 64
        out = []
        for i in range(0, len(xs), bs):
            xb = xs[i:i + bs]
            if fast:
                xb = xb[:, :int(xb.ne(WordTokenizer.PAD).sum(1).max())]
            out.append((xb, ys[i:i + bs]))
        return out

    def f1(tp_, fp_, fn_):
        return 2 * tp_ / max(1.0, 2 * tp_ + fp_ + fn_)

    # tp fp fn tn, loss sum. One buffer for the whole run: a tensor that gloo's worker thread
    # still holds when Python drops it is freed by that thread, which needs the GIL; at
    # interpreter exit that deadlocks (torch 1.13, seen here), so no all-reduced tensor may die
    # before the process group.
    counts = torch.zeros(5, dtype=torch.float64, device=device)

    def evaluate(batches):
        model.eval()
        counts.zero_()
        with torch.no_grad():
            for xb, yt in batches:
                logits = model(xb.to(device))
                pred = logits.argmax(-1).cpu()
                loss_sum = F.cross_entropy(logits.float(), yt.to(device), reduction="sum").item()
                counts.add_(torch.tensor([((pred == 1) & (yt == 1)).sum().item(), ((pred == 1) & (yt == 0)).sum().item(),
                                          ((pred == 0) & (yt == 1)).sum().item(), ((pred == 0) & (yt == 0)).sum().item(),
                                          loss_sum], dtype=torch.float64, device=device))
        if distributed:
            dist.all_reduce(counts)
        tp, fp, fn, tn, loss_sum = counts.tolist()
        n = max(1.0, tp + fp + fn + tn)
        return {"accuracy": (tp + tn) / n, "f1": (f1(tp, fp, fn) + f1(tn, fn, fp)) / 2,
                "f1_positive": f1(tp, fp, fn), "loss": loss_sum / n}

    def report(step, m):
        if rank == 0:
            print("gpujob-metric: " + json.dumps({"step": step, "accuracy": round(m["accuracy"], 4),
                                                  "f1": round(m["f1"], 4), "loss": round(m["loss"], 4)}),
                  flush=True)

    periodic_eval = eval_batches(args.eval_metric_size, fast=True) if args.eval_every else []
    eval_seconds = 0.0  # periodic evaluations, left out of the training time and throughput

    # ---- train
    step = start_step
    last_ckpt = start_step
    t_train = time.time()
    recent = deque(maxlen=args.loss_window)
    win_n, win_t = 0, time.time()
    samples_done = 0
    ddp.train()
    epoch, k0 = start_epoch, start_k
    while step < total_steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.long)
        for k in range(k0, steps_per_epoch):
            if step >= total_steps:
                break
            idx = order[k * local_batch:(k + 1) * local_batch]
            xb, yb = x_train[idx].to(device, non_blocking=True), y_train[idx].to(device, non_blocking=True)
            torch.manual_seed(args.seed * 1_000_003 + step * 1009 + rank)  # dropout stream
            loss = F.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces (averages) the gradients
            opt.step()
            sched.step()
            step += 1
            samples_done += args.global_batch
            recent.append(loss.item())
            win_n += 1
            if step % args.log_every == 0 or step == total_steps:
                lw = torch.tensor([sum(recent) / len(recent)], dtype=torch.float64, device=device)
                mean_local = lw.item()
                if distributed:
                    dist.all_reduce(lw)
                    lw /= world
                now = time.time()
                sps = win_n * args.global_batch / max(now - win_t, 1e-9)
                log(f"step={step} epoch={epoch} rank={rank} loss={mean_local:.4f} "
                    f"global_loss={lw.item():.4f} samples_per_sec={sps:.1f} "
                    f"lr={sched.get_last_lr()[0]:.6f} world_size={world}")
                win_n, win_t = 0, now
            # Before the checkpoint, so a step that has a checkpoint has had its metric line.
            # The last step's evaluation is the final one, below.
            if args.eval_every and step % args.eval_every == 0 and step < total_steps:
                t_eval = time.time()
                report(step, evaluate(periodic_eval))
                ddp.train()
                dt = time.time() - t_eval
                eval_seconds += dt
                win_t += dt
            if ckdir and args.checkpoint_every and step % args.checkpoint_every == 0 and rank == 0:
                checkpoint(step, epoch, k + 1)
                last_ckpt = step
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
        else:
            epoch, k0 = epoch + 1, 0
            continue
        break
    if distributed:
        dist.barrier()
    train_seconds = time.time() - t_train - eval_seconds
    if ckdir and rank == 0 and last_ckpt != step and step > start_step:
        checkpoint(step, epoch, k + 1)

    # ---- evaluate: the whole held-out split, in its order (the result's figures)
    final = evaluate(eval_batches(0, fast=False))
    report(step, final)
    trained = step - start_step
    if rank == 0:
        result = {"accuracy": round(final["accuracy"], 4), "f1": round(final["f1"], 4),
                  "f1_positive": round(final["f1_positive"], 4),
                  "wall_seconds": round(time.time() - T_PROCESS_START, 2),
                  "train_seconds": round(train_seconds, 2), "steps": step, "steps_this_run": trained,
                  "world_size": world, "global_batch": args.global_batch, "resumed_from_step": start_step,
                  "restart_count": restart_count,
                  "samples_per_sec": round(samples_done / max(train_seconds, 1e-9), 1),
                  "eval_size": args.eval_size, "backend": backend if distributed else "none",
                  "device": str(device)}
        print("gpujob-result: " + json.dumps(result), flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
