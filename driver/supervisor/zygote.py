# gpujob's preloaded interpreter (a "zygote"), one per local rank slot.
#
# The supervisor starts `<command> -c <bootstrap> gpujob-preload MODULE...`
# with a SOCK_SEQPACKET socket on fd 3; the bootstrap (zygoteBootstrap in
# zygote.go) binds it to the global `ctl` and runs this source, the socket's
# first message, so that `ps` shows a short command line. The zygote imports MODULE... once, says whether
# that worked, and then, for each request, forks a child that becomes the
# rank: it takes the request's environment, argv, working directory and stdio
# (three descriptors passed with the request) and runs the user's script as
# __main__ with runpy, as `python3 script.py` would. The zygote waits for the
# child and reports its raw wait status; the supervisor does everything else
# (signals, process-group kills, restarts) by PID, as for a rank it started.
#
# Nothing here may initialise CUDA, start a thread or open a socket before
# the fork: a forked child gets a copy of the parent's memory but only the
# thread that called fork, so a lock another thread held (CUDA's driver
# state, an OpenMP pool, a logging handler) stays locked forever in the
# child, and a CUDA context cannot be used across fork at all. The zygote
# checks what it can (threads, CUDA) after the imports and refuses to serve
# if either is there: the supervisor then starts that slot's ranks cold.
#
# Messages are JSON objects, one per packet.
#   zygote -> supervisor: {"ready": true, "pid": P} | {"ready": false, "error": "..."}
#                         {"forked": PID} then {"exited": PID, "status": RAW}
#   supervisor -> zygote: {"argv": [...], "env": {...}, "dir": "...", "mode": "script"|"module",
#                          "target": "...", "unbuffered": bool, "no_bytecode": bool} + 3 fds
import array
import ctypes
import importlib
import io
import json
import os
import runpy
import signal
import socket
import sys


def send(obj):
    try:
        ctl.send(json.dumps(obj).encode())
    except OSError:
        os._exit(0)  # the supervisor is gone: so is the reason to be


def fail(why):
    send({"ready": False, "error": why})
    sys.exit(0)


# The bootstrap's `-c` leaves argv as ["-c", "gpujob-preload", MODULE...].
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: nothing may escape
        fail("import %s: %s: %s" % (name, type(e).__name__, e))

threads = len(os.listdir("/proc/self/task"))
if threads != 1:
    fail("importing %s started %d threads; forking would copy only one of them" % (", ".join(sys.argv[2:]), threads))
torch = sys.modules.get("torch")
if torch is not None and torch.cuda.is_initialized():
    fail("importing %s initialised CUDA, which a forked child cannot use" % ", ".join(sys.argv[2:]))

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
zygote_pid = os.getpid()
send({"ready": True, "pid": zygote_pid})


def receive():
    fds = array.array("i")
    msg, anc, _, _ = ctl.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    if not msg:
        os._exit(0)  # the supervisor is gone or done with this slot
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return json.loads(msg), list(fds)


def rewrite_environ(env):
    """Makes /proc/PID/environ show the rank's environment, as it would for a
    rank started cold (operators and tools read it there). The kernel shows
    the region the process started with; the supervisor padded the zygote's
    environment so that the rank's fits in it. Python's os.environ no longer
    points into that region once it was cleared, so it is free to reuse."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])
    except (OSError, IndexError, ValueError):
        return
    data = b"".join(k.encode() + b"=" + v.encode() + b"\0" for k, v in env.items())
    if len(data) > end - start:
        return
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def become_rank(req, fds):
    """Runs in the forked child: everything a fresh `python3 ...` would have
    different from the zygote is set here, before any of the user's code."""
    os.setpgid(0, 0)  # its own process group, as the supervisor gives cold ranks
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != zygote_pid:
        os._exit(137)  # the zygote died between fork and prctl: no one would reap or stop us
    ctl.close()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["dir"])
    os.environ.clear()
    os.environ.update(req["env"])
    rewrite_environ(req["env"])
    if req.get("no_bytecode"):
        sys.dont_write_bytecode = True
    if req.get("unbuffered") or req["env"].get("PYTHONUNBUFFERED"):
        # What -u gives: an unbuffered binary layer under a write-through
        # text layer (the zygote's own streams were set up buffered).
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            new = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding,
                                   errors=old.errors, write_through=True)
            setattr(sys, name, new)
            setattr(sys, "__%s__" % name, new)
    sys.argv = list(req["argv"])
    # python3 puts the script's directory first on sys.path (symlinks
    # resolved), python3 -m the working directory; `-c` left "".
    if req["mode"] == "module":
        sys.path[0] = os.getcwd()
    else:
        sys.path[0] = os.path.dirname(os.path.realpath(req["target"]))
    # What the user put in PYTHONPATH comes after it, as at startup.
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra


while True:
    req, fds = receive()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        become_rank(req, fds)
        break
    for fd in fds:
        os.close(fd)
    # The child makes its own group too; whichever of us comes first, the
    # supervisor finds the rank leading its group when it checks the report.
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it already, or is gone: its exit is reported below
    send({"forked": pid})
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    send({"exited": pid, "status": status})

# The child, at the top level of this module so that nothing of the loop above
# is on the stack: the user's code runs as __main__; an exception it raises
# prints its traceback and exits 1, SystemExit exits with its code, as under
# `python3 script.py`.
if req["mode"] == "module":
    runpy._run_module_as_main(req["target"], alter_argv=True)
else:
    runpy.run_path(req["target"], run_name="__main__")
