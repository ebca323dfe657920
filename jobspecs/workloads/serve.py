#!/usr/bin/python3
"""HTTP model server for the classifier that bert_finetune.py trains (gpujob services).

Loads the newest readable checkpoint of a bert_finetune.py run (or a freshly initialised model)
and answers POST /predict with the sentiment label and its probability. The model shape, the
seed and the corpus size come from the configuration fingerprint stored in the checkpoint; the
word-level vocabulary is rebuilt from the same seeded corpus, exactly as the training did.
Uses only the standard library and torch (CPU). See README.md next to this file.

  PORT=8080 /usr/bin/python3 serve.py --checkpoint /ckpt/default/bert --version v3

stderr (one line per milestone):
  serve: listening on 0.0.0.0:8080 version=v3 replica=...
  serve: model loaded from /ckpt/default/bert/ckpt-000000640.pt (step 640) in 1.92 s
  serve: SIGTERM: draining (1 in flight)
  serve: stopped
"""
import argparse
import json
import os
import shlex
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# bert_finetune.py sits next to this file. Importing it only defines functions and constants
# (its main() runs under `if __name__ == "__main__"` and torch is imported inside main), so
# nothing needs guarding. No .pyc files next to the scripts: the directory may be read-only.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bert_finetune as bert  # noqa: E402

PROG = "serve"
LABELS = ["negative", "positive"]  # bert_finetune.py: label 1 draws positive adjectives
MAX_BODY = 1 << 20  # bytes of a /predict request body
MAX_TEXTS = 256  # texts of one /predict request
IDLE_TIMEOUT = 600.0  # seconds an idle keep-alive connection is kept open
DRAIN_TIMEOUT = 5.0  # seconds SIGTERM waits for in-flight requests


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def fail(msg, code=2):
    log(f"error: {msg}")
    sys.stderr.flush()
    os._exit(code)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="HTTP server for the bert_finetune.py classifier.")
    ap.add_argument("--port", type=bert.nonneg_int, default=None,
                    help="TCP port (default: $PORT, required; 0 picks a free one, logged)")
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    ap.add_argument("--checkpoint", default="", metavar="DIR",
                    help="bert_finetune.py checkpoint directory; the newest readable ckpt-*.pt is served")
    ap.add_argument("--no-checkpoint", action="store_true",
                    help="serve a freshly initialised model (also when --checkpoint is empty)")
    ap.add_argument("--seed", type=bert.nonneg_int, default=None,
                    help="without a checkpoint: corpus/vocabulary and init seed (default: bert_finetune's, 1234)")
    ap.add_argument("--train-args", default="", metavar="ARGS",
                    help="without a checkpoint: bert_finetune.py options giving the model shape, e.g. "
                         "'--d-model 128 --layers 4' (default: its defaults); a checkpoint carries its own")
    ap.add_argument("--load-delay", type=bert.nonneg_float, default=0.0, metavar="SECONDS",
                    help="sleep this long before loading (simulates a big model)")
    ap.add_argument("--version", default=os.environ.get("GPUJOB_SERVICE_VERSION") or "v0",
                    help="model version reported in every response (default: $GPUJOB_SERVICE_VERSION, else v0)")
    ap.add_argument("--service-time", type=bert.nonneg_float, default=0.0, metavar="SECONDS",
                    help="extra sleep per /predict request (benchmarks)")
    ap.add_argument("--fail-health", action="store_true",
                    help="/healthz never reports healthy (tests an update that never becomes healthy)")
    ap.add_argument("--access-log", action="store_true", help="one stderr line per request")
    a = ap.parse_args(argv)
    if a.port is None:
        p = os.environ.get("PORT", "")
        if p == "":
            ap.error("no port: set $PORT or pass --port")
        try:
            a.port = bert.nonneg_int(p)
        except argparse.ArgumentTypeError as e:
            ap.error(f"$PORT: {e}")
    if a.port > 65535:
        ap.error(f"port {a.port} is out of range")
    if a.no_checkpoint:
        a.checkpoint = ""
    a.train = None
    if not a.checkpoint:  # the shape of the fresh model, checked before listening
        extra = shlex.split(a.train_args) + (["--seed", str(a.seed)] if a.seed is not None else [])
        try:
            a.train = bert.parse_args(extra)
        except SystemExit:
            ap.error(f"bad --train-args {a.train_args!r} (see bert_finetune's message above)")
    return a


# --------------------------------------------------------------------------- model

def encoder_classifier(torch):
    """bert_finetune.py's EncoderClassifier. That script defines it inside main(), where it
    cannot be imported, so it is repeated here: keep the two identical (the parameter names
    must match the checkpoint's state dict, which load_state_dict checks strictly)."""
    nn = torch.nn
    WordTokenizer = bert.WordTokenizer

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

    return EncoderClassifier


# The training options the model and vocabulary depend on; bert_finetune.py stores them all in
# the checkpoint's "fingerprint" (with "vocab", the vocabulary size it built).
SHAPE_KEYS = ("seed", "train_size", "seq_len", "d_model", "heads", "ff", "layers", "dropout")


def newest_checkpoint(torch, d):
    """Newest readable bert_finetune checkpoint in d (bert_finetune.load_latest without the
    fingerprint comparison: the server takes whatever configuration the checkpoint has)."""
    if not os.path.isdir(d):
        raise RuntimeError(f"checkpoint directory {d} does not exist")
    for step, path in reversed(bert.list_checkpoints(d)):
        try:
            st = torch.load(path, map_location="cpu")
            if not isinstance(st, dict) or st.get("format") != 1 or st.get("step") != step:
                raise ValueError("not a bert_finetune checkpoint")
            fp = st.get("fingerprint")
            missing = [k for k in SHAPE_KEYS + ("vocab",) if not isinstance(fp, dict) or k not in fp]
            if missing or not isinstance(st.get("model"), dict):
                raise ValueError(f"no model or configuration {missing} in it")
        except Exception as e:  # truncated/corrupt file: fall back to the previous one
            log(f"warning: skipping unreadable checkpoint {path}: {e}")
            continue
        return st, path
    raise RuntimeError(f"no readable bert_finetune checkpoint (ckpt-*.pt) in {d}")


class Model:
    """The loaded classifier: tokenizer, network and where it came from."""

    def __init__(self, torch, cfg, state=None, path=None, step=None):
        self.torch = torch
        self.cfg = cfg
        self.path, self.step = path, step
        # The vocabulary is built from the training split alone, which depends only on (seed,
        # train_size): the held-out split comes from another RNG.
        train, _ = bert.make_corpus(cfg["seed"], cfg["train_size"], 0, 0.0)
        self.tok = bert.WordTokenizer(t for t, _ in train)
        if state is not None and cfg.get("vocab") != len(self.tok):
            raise RuntimeError(f"{path}: the rebuilt vocabulary has {len(self.tok)} words, the checkpoint "
                               f"{cfg.get('vocab')}: not the corpus bert_finetune.py builds")
        torch.manual_seed(cfg["seed"])  # without a checkpoint: the training's initial weights
        self.net = encoder_classifier(torch)(len(self.tok), cfg["seq_len"], cfg["d_model"], cfg["heads"],
                                             cfg["ff"], cfg["layers"], cfg["dropout"])
        if state is not None:
            self.net.load_state_dict(state)
        self.net.eval()
        self.lock = threading.Lock()

    def predict(self, texts):
        torch = self.torch
        ids = torch.tensor([self.tok.encode(t, self.cfg["seq_len"]) for t in texts], dtype=torch.long)
        with self.lock, torch.no_grad():
            probs = torch.softmax(self.net(ids).float(), dim=-1)
        score, idx = probs.max(dim=-1)
        return [{"label": LABELS[i], "score": s} for i, s in zip(idx.tolist(), score.tolist())]


def load_model(args):
    import torch

    omp = os.environ.get("OMP_NUM_THREADS", "1")
    try:
        torch.set_num_threads(max(1, int(omp)))
    except ValueError:
        raise RuntimeError(f"OMP_NUM_THREADS={omp!r} is not an integer")
    if args.checkpoint:
        st, path = newest_checkpoint(torch, args.checkpoint)
        return Model(torch, dict(st["fingerprint"]), st["model"], path, st["step"])
    return Model(torch, {k: getattr(args.train, k) for k in SHAPE_KEYS})


# --------------------------------------------------------------------------- HTTP

class State:
    def __init__(self, args, replica):
        self.args = args
        self.version = args.version
        self.replica = replica
        self.model = None  # set once loaded
        self.draining = False
        self.inflight = 0
        self.mu = threading.Lock()

    def status(self):
        if self.draining:
            return "draining"
        if self.args.fail_health:
            return "failing"
        return "ok" if self.model is not None else "loading"


class BadRequest(Exception):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length
    server_version = "gpujob-serve/1"
    disable_nagle_algorithm = True  # headers and body are two writes: no Nagle/delayed-ACK stall
    timeout = IDLE_TIMEOUT
    state = None  # State, set by main

    # ---- plumbing

    def version_string(self):  # the Server header
        return self.server_version

    def log_message(self, fmt, *a):
        if self.state.args.access_log:
            log(f"access {self.client_address[0]} {fmt % a}")

    def reply(self, code, obj, headers=()):
        body = (json.dumps(obj) + "\n").encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Model-Version", self.state.version)
            for k, v in headers:
                self.send_header(k, v)
            if self.close_connection or self.state.draining:
                self.send_header("Connection", "close")  # also sets close_connection
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client went away
            self.close_connection = True

    def send_error(self, code, message=None, explain=None):
        # http.server's own errors (bad request line, unsupported method, ...), as JSON
        self.close_connection = True
        self.reply(code, {"error": message or HTTPStatus(code).phrase, "version": self.state.version})

    def dispatch(self):
        with self.state.mu:
            self.state.inflight += 1
        try:
            path = self.path.split("?", 1)[0]
            routes = {"/healthz": {"GET": self.healthz, "HEAD": self.healthz},
                      "/": {"GET": self.index, "HEAD": self.index},
                      "/predict": {"POST": self.predict}}
            methods = routes.get(path)
            if methods is None:
                self.discard_body()
                self.reply(404, {"error": f"no such path: {path}", "version": self.state.version})
            elif self.command not in methods:
                self.discard_body()
                self.reply(405, {"error": f"{self.command} not allowed on {path}", "version": self.state.version},
                           [("Allow", ", ".join(methods))])
            else:
                methods[self.command]()
        except BadRequest as e:
            self.reply(e.code, {"error": str(e), "version": self.state.version})
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            self.reply(500, {"error": f"internal error: {e}", "version": self.state.version})
        finally:
            with self.state.mu:
                self.state.inflight -= 1

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = dispatch

    def read_body(self):
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise BadRequest(411, "chunked bodies are not supported: send Content-Length")
        n = self.headers.get("Content-Length")
        if n is None:
            self.close_connection = True
            raise BadRequest(411, "Content-Length required")
        try:
            n = int(n)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise BadRequest(400, f"bad Content-Length {n!r}")
        if n > MAX_BODY:
            self.close_connection = True
            raise BadRequest(413, f"body of {n} bytes is over {MAX_BODY}")
        body = self.rfile.read(n)
        if len(body) != n:
            self.close_connection = True
            raise BadRequest(400, "short body")
        return body

    def discard_body(self):
        """Keep the connection in step: read (or give up on) a body nobody wants."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if 0 <= n <= MAX_BODY:
            if len(self.rfile.read(n)) == n:
                return
        self.close_connection = True

    # ---- endpoints

    def healthz(self):
        s = self.state.status()
        self.reply(200 if s == "ok" else 503, {"status": s, "version": self.state.version})

    def index(self):
        st, m = self.state, self.state.model
        self.reply(200, {"service": "gpujob-serve", "version": st.version, "replica": st.replica,
                         "loaded": m is not None, "status": st.status(), "labels": LABELS,
                         "in_flight": st.inflight - 1,  # requests being handled, besides this one
                         "checkpoint": m.path if m else None, "step": m.step if m else None,
                         "model": dict(m.cfg) if m else None})

    def predict(self):
        body = self.read_body()
        model = self.state.model
        if model is None:
            raise BadRequest(503, "model not loaded yet")
        try:
            req = json.loads(body)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise BadRequest(400, f"bad JSON: {e}")
        if not isinstance(req, dict):
            raise BadRequest(400, 'want a JSON object {"text": "..."} or {"texts": ["...", ...]}')
        if ("text" in req) == ("texts" in req):
            raise BadRequest(400, 'want exactly one of "text" (a string) and "texts" (a list of strings)')
        if "text" in req:
            if not isinstance(req["text"], str):
                raise BadRequest(400, '"text" must be a string')
            texts = [req["text"]]
        else:
            texts = req["texts"]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise BadRequest(400, '"texts" must be a non-empty list of strings')
            if len(texts) > MAX_TEXTS:
                raise BadRequest(400, f'"texts" has {len(texts)} entries, at most {MAX_TEXTS}')
        preds = model.predict(texts)
        if self.state.args.service_time:
            time.sleep(self.state.args.service_time)
        out = dict(preds[0]) if "text" in req else {"predictions": preds}
        out.update(version=self.state.version, replica=self.state.replica)
        self.reply(200, out)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # idle keep-alive connections must not hold up the exit
    request_queue_size = 128

    def server_bind(self):
        # HTTPServer.server_bind resolves the bind address with getfqdn: a DNS lookup that can
        # stall for seconds, before the port is even listening. Not needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that went away
        super().handle_error(request, client_address)


# --------------------------------------------------------------------------- main

def main(argv):
    args = parse_args(argv)
    try:
        srv = Server((args.host, args.port), Handler)
    except OSError as e:
        fail(f"cannot listen on {args.host}:{args.port}: {e}")
    port = srv.server_address[1]
    replica = os.environ.get("NOMAD_ALLOC_ID") or f"{socket.gethostname()}:{port}"
    state = State(args, replica)
    Handler.state = state

    stop = threading.Event()
    signame = []

    def on_signal(signum, _frame):
        signame.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                     name="http").start()
    log(f"listening on {args.host}:{port} version={args.version} replica={replica}")

    load_error = []

    def loader():
        t0 = time.time()
        try:
            if args.load_delay:
                time.sleep(args.load_delay)
            m = load_model(args)
        except Exception as e:
            load_error.append(str(e) or repr(e))
            stop.set()
            return
        state.model = m
        src = f"{m.path} (step {m.step})" if m.path else f"a fresh initialisation (seed {m.cfg['seed']})"
        log(f"model loaded from {src} in {time.time() - t0:.2f} s")

    threading.Thread(target=loader, daemon=True, name="loader").start()

    while not stop.wait(0.5):
        pass
    if load_error and not signame:
        fail(f"loading the model: {load_error[0]}")

    # Stop accepting, let in-flight requests finish (their responses say Connection: close).
    state.draining = True
    log(f"{signame[0] if signame else 'stop'}: draining ({state.inflight} in flight)")
    srv.shutdown()
    srv.server_close()
    deadline = time.time() + DRAIN_TIMEOUT
    while state.inflight > 0 and time.time() < deadline:
        time.sleep(0.01)
    left = state.inflight
    log("stopped" + (f", {left} request(s) cut off after {DRAIN_TIMEOUT:g} s" if left else ""))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # daemon threads (idle keep-alive connections) end with the process


if __name__ == "__main__":
    main(sys.argv[1:])
