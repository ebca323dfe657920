#!/usr/bin/python3
"""Trace replay: gpujob's queue vs plain Nomad vs Nomad with batch preemption, on one seeded trace.

One trace of gang jobs of two teams (weights 2:1) is replayed on a dev cluster of its own (3 clients x 4
fake GPUs by default), three ways, interleaved (run i replays it once per arm, in an order rotated by i):

    queue          gpujob's queue: a queue file with one queue per team (quota in GPUs proportional to
                   its weight, borrowing on, one cohort, the weights), applied with `gpujob queue apply`,
                   which starts the admission controller (a Nomad job); each job `gpujob submit --detach`ed
                   into its team's queue at its arrival time
    nomad          plain Nomad (the anchor): no queue configuration, the same jobs `gpujob submit
                   --detach`ed, registered directly; Nomad places members one by one and a partly placed
                   gang holds its GPUs until the rest is placed
    nomad-preempt  the same with Nomad's batch preemption on (`nomad operator scheduler set-config
                   -preempt-batch-scheduler=true`, restored after) and the teams' jobs at different
                   priorities (the heavier team's higher, by at least Nomad's 10)

The trace (seeded, the same for every arm and run): --jobs jobs, each of 1-8 GPUs as a gang of 1-GPU
workers or of workers of several GPUs (never more than a node holds). GPUs per job 1, 2, 4, 8 with
weights --sizes (default 40/20/20/20: gang-heavier than the simulator's Philly shape, --sizes
1:70,2:10,4:10,8:7, which on 12 GPUs gives 40 jobs only 3 gangs of several members); a multi-GPU job is
one worker per GPU half the time (as in internal/queue/sim), else the fewest workers that fit on nodes;
run times log-normal (median 20 s, sigma 0.8) clipped to 5-60 s (the simulator's heavy tail, squeezed
into the issue's range); the jobs split evenly between the teams, shuffled; Poisson arrivals at the
rate that offers --load (GPU-seconds asked per GPU-second the cluster has), the first at 0.
--time-scale divides run times and gaps, for smoke runs; the figures are for scale 1 only.

Every rank (python3 -S, the gpujob driver: one rank per GPU, started only once every member has joined
the rendezvous) writes its start time, works by sleeping what is left of the job's run time (rank 0
checkpoints its progress in the job's directory, so a gang stopped and started again resumes, in every
arm alike), and writes its end time (or, on SIGTERM, its stop time). The harness records per job: submit
(just before `gpujob submit` runs), first member placed (the earliest CreateTime of its allocations),
gang complete (every rank started), end (the last rank's end), and from Nomad's allocations, polled, the
members holding GPUs. Per arm, with the simulator's definitions:

    utilisation       GPU-seconds of complete gangs running (the ranks' intervals) / (GPUs x makespan)
    util. while waiting  the same over the time some job waits (submitted, not running, not ended)
    mean / p95 JCT    submit -> end (p95: nearest rank)
    makespan          first submit -> last end
    idle-held         GPU-seconds held by members of a gang that is not whole (0 < members holding <
                      members), before it is complete: a partly placed gang waiting for the rest, or
                      what is left of one after a member was evicted; not a whole gang's own stop
    team shares       each team's part of the busy GPU-seconds while both teams have a job waiting,
                      against its weight's part of the weights
    restarted gangs   jobs whose ranks started more than once (a gang stopped or broken, then resumed)
    members evicted   allocations Nomad's preemption evicted

A run in which partly placed gangs hold GPUs the rest of each needs, so that nothing changes for 2
minutes (3 at scale 1), is reported as deadlocked: a result of that arm, without figures (the ranks'
rendezvous_timeout, 30 min here, would fail such jobs in the end). Between arms every job is purged,
the queue configuration and records deleted, the controller stopped, the scheduler configuration
restored, and the next arm starts once no process of the trial is left (BENCH_TRIAL). Run it through
the wrapper (which starts and stops the dev cluster):

    scripts/bench/queue-replay.sh [--runs 5] [--jobs 40] [--seed 1] [--time-scale 1]
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

ARMS = ["queue", "nomad", "nomad-preempt"]
ANCHOR = "nomad"
CONFIG_KEY = bl.QUEUE_CONFIG_KEY
QUEUES_TREE = "gpujob/queues"
CONTROLLER_JOB = "gpujob-queue-controller"
TEAMS = [("team-a", 2.0), ("team-b", 1.0)]  # name, weight (jobs split 50/50)
PRIORITY = {"team-a": 70, "team-b": 50}  # nomad-preempt only; Nomad preempts at a difference of >= 10
DEFAULT_SIZES = "1:40,2:20,4:20,8:20"
PHILLY_SIZES = "1:70,2:10,4:10,8:7"  # the simulator's Philly shape up to 8 GPUs

# A rank: start stamp, the work (sleeping what is left of the job's run time), end stamp. Rank 0
# keeps the job's progress in BENCH_JOB_DIR/progress; on SIGTERM it saves it and every rank writes
# its stop time. The file's mtime is a heartbeat: a rank killed outright ends there.
RANK = r'''
import os, signal, sys, time
d = os.environ["BENCH_JOB_DIR"]
dur = float(os.environ["BENCH_DURATION"])
rank = int(os.environ.get("RANK", "0"))
t0 = time.time()
me = os.path.join(d, "r%d.%d" % (rank, os.getpid()))
with open(me, "w") as f:
    f.write("start %.6f\n" % t0)
done = 0.0
try:
    with open(os.path.join(d, "progress")) as f:
        done = float(f.read())
except (OSError, ValueError):
    pass
def save(now):
    if rank == 0:
        p = os.path.join(d, "progress")
        with open(p + ".tmp", "w") as f:
            f.write("%.6f" % min(dur, done + now - t0))
        os.replace(p + ".tmp", p)
def stop(_sig, _frame):
    now = time.time()
    save(now)
    with open(me, "a") as f:
        f.write("stop %.6f\n" % now)
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
left = dur - done
while True:
    now = time.time()
    if now - t0 >= left:
        break
    time.sleep(min(0.25, left - (now - t0)))
    save(time.time())
    os.utime(me)
now = time.time()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
save(now)
with open(me, "a") as f:
    f.write("end %.6f\n" % now)
'''

METRICS = [
    # key, label, unit, digits, scale (for printing)
    ("utilisation", "GPU utilisation", "%", 1, 100),
    ("util_waiting", "utilisation while jobs wait", "%", 1, 100),
    ("mean_jct", "mean JCT", "s", 1, 1),
    ("p95_jct", "p95 JCT", "s", 1, 1),
    ("makespan", "makespan", "s", 1, 1),
    ("idle_held", "GPU-s held idle by partial gangs", "GPU-s", 1, 1),
    ("share_team-a", "team-a share while both wait", "", 3, 1),
    ("share_team-b", "team-b share while both wait", "", 3, 1),
    ("restarted", "gangs restarted", "", 0, 1),
    ("evicted", "members evicted by Nomad's preemption", "", 0, 1),
    ("mean_wait", "mean submit -> gang complete", "s", 1, 1),
]


# ---- the trace -----------------------------------------------------------------------------


def parse_sizes(text):
    out = []
    for part in text.split(","):
        g, w = part.split(":")
        g, w = int(g), float(w)
        if not 1 <= g <= 8 or w <= 0:
            raise ValueError(f"--sizes: {part}: want GPUS:WEIGHT with 1 <= GPUS <= 8 and WEIGHT > 0")
        out.append((g, w))
    return out


def make_trace(seed, n, gpus_total, gpus_per_node, load, sizes):
    """n jobs, at scale 1: [{id, team, members, per, gpus, dur, at}], the first arriving at 0."""
    rng = random.Random(seed)
    total_w = sum(w for _, w in sizes)
    teams = [TEAMS[i % 2][0] for i in range(n)]
    rng.shuffle(teams)
    jobs, work = [], 0.0
    for i in range(n):
        u, acc, size = rng.random() * total_w, 0.0, sizes[-1][0]
        for g, w in sizes:
            acc += w
            if u < acc:
                size = g
                break
        if size > gpus_per_node and size % gpus_per_node:
            raise ValueError(f"a {size}-GPU job cannot be split into workers of one node's {gpus_per_node} GPUs")
        if size > 1 and rng.random() < 0.5:
            members, per = size, 1
        else:
            members = -(-size // gpus_per_node)
            per = size // members
        dur = min(max(math.exp(math.log(20) + 0.8 * rng.gauss(0, 1)), 5.0), 60.0)
        jobs.append({"id": f"j{i:03d}", "team": teams[i], "members": members, "per": per, "gpus": size,
                     "dur": round(dur, 2), "at": 0.0})
        work += size * dur
    rate = load * gpus_total / (work / n)  # jobs per second
    at = 0.0
    for i, j in enumerate(jobs):
        if i:
            at += rng.expovariate(rate)
        j["at"] = round(at, 2)
    return jobs, work


def quotas(gpus_total):
    """Each team's quota, proportional to its weight, whole GPUs adding up to the cluster."""
    wsum = sum(w for _, w in TEAMS)
    q = {name: int(gpus_total * w / wsum) for name, w in TEAMS}
    q[TEAMS[0][0]] += gpus_total - sum(q.values())
    return q


def spec_hcl(name, j, arm, env, grace):
    envs = "\n".join(f"    {k} = {bl.hcl_str(v)}" for k, v in env.items())
    extra = ""
    if arm == "queue":
        extra += f"  queue    = {bl.hcl_str(j['team'])}\n"
    if arm == "nomad-preempt":
        extra += f"  priority = {PRIORITY[j['team']]}\n"
    return f"""train "{name}" {{
  workers         = {j['members']}
  gpus_per_worker = {j['per']}
  command         = "/usr/bin/python3"
  args            = {bl.hcl_list(["-S", env["BENCH_RANK_PY"]])}
{extra}  env = {{
{envs}
  }}
  resources {{
    cpu    = 20
    memory = 64
  }}
  max_failures       = 100
  rendezvous_timeout = "30m"
  checkpoint_grace   = "{grace}s"
}}
"""


# ---- cluster access ------------------------------------------------------------------------


def cluster_gpus(nomad):
    """(total GPUs, GPUs per node) of the ready nodes."""
    per = []
    for stub in nomad.get("/v1/nodes"):
        if stub.get("Status") != "ready":
            continue
        node = nomad.get(f"/v1/node/{stub['ID']}")
        n = 0
        for d in (node.get("NodeResources") or {}).get("Devices") or []:
            if d.get("Type") == "gpu":
                n += sum(1 for i in d.get("Instances") or [] if i.get("Healthy", True))
        if n:
            per.append(n)
    if not per:
        raise SystemExit("no ready node with GPUs in the dev cluster")
    return sum(per), min(per)


def scheduler_batch_preemption(nomad):
    cfg = nomad.call("GET", "/v1/operator/scheduler/configuration")["SchedulerConfig"]
    return bool(cfg["PreemptionConfig"].get("BatchSchedulerEnabled"))


def set_batch_preemption(nomad, on):
    p = subprocess.run([nomad.bin, "operator", "scheduler", "set-config",
                        f"-preempt-batch-scheduler={'true' if on else 'false'}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"nomad operator scheduler set-config: {p.stdout}")
    if scheduler_batch_preemption(nomad) != on:
        raise RuntimeError(f"batch preemption still {not on} after set-config")


def arm_allocs(nomad, prefix):
    """Allocations of the jobs named prefix*."""
    flt = urllib.parse.quote(f'JobID matches "^{prefix}"')
    try:
        allocs = nomad.get(f"/v1/allocations?filter={flt}")
    except urllib.error.HTTPError:
        allocs = nomad.get("/v1/allocations")
    return [a for a in allocs if a.get("JobID", "").startswith(prefix)]


HOLDING_ENDS = ("Killing", "Killed", "Terminated", "Not Restarting", "Sibling Task Failed")


def terminal(a):
    return a.get("DesiredStatus") != "run" or a.get("ClientStatus") not in ("pending", "running")


def release_time(a, seen):
    """When a terminal allocation stopped holding its GPUs: the earliest of its kill or exit events
    and the poll that first saw it terminal."""
    t = seen
    for ts in (a.get("TaskStates") or {}).values():
        for ev in ts.get("Events") or []:
            if ev.get("Type") in HOLDING_ENDS and ev.get("Time"):
                t = min(t, ev["Time"] / 1e9)
    return t


# ---- one replay ------------------------------------------------------------------------------


def read_ranks(job_dir):
    """{rank: [(start, end or None, how, mtime)]} from the ranks' stamp files."""
    out = {}
    try:
        names = os.listdir(job_dir)
    except OSError:
        return out
    for name in names:
        if not name.startswith("r") or "." not in name:
            continue
        path = os.path.join(job_dir, name)
        try:
            with open(path) as f:
                lines = f.read().split("\n")
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        start = end = how = None
        for line in lines:
            parts = line.split()
            if len(parts) != 2:
                continue
            try:
                v = float(parts[1])
            except ValueError:
                continue
            if parts[0] == "start":
                start = v
            elif parts[0] in ("end", "stop"):
                end, how = v, parts[0]
        if start is None:
            continue
        rank = int(name[1:].split(".")[0])
        out.setdefault(rank, []).append((start, end, how, mtime))
    return out


def replay(nomad, consul, a, ctx, trial, arm, trace, scratch, cleanup):
    """Replays the trace in one arm; returns the per-job records and the arm's figures."""
    trial_dir = os.path.join(scratch, trial)
    os.makedirs(trial_dir)
    os.chmod(trial_dir, 0o777)
    prefix = trial + "-"
    names = {j["id"]: prefix + j["id"] for j in trace}
    env_base = {"BENCH_TAG": ctx["tag"], "BENCH_TRIAL": trial, "BENCH_RANK_PY": ctx["rank_py"]}
    spec_paths = {}
    for j in trace:
        job_dir = os.path.join(trial_dir, j["id"])
        os.makedirs(job_dir)
        os.chmod(job_dir, 0o777)
        env = dict(env_base, BENCH_JOB_DIR=job_dir, BENCH_DURATION=f"{j['dur'] / a.time_scale:.3f}")
        spec_paths[j["id"]] = os.path.join(trial_dir, j["id"] + ".hcl")
        with open(spec_paths[j["id"]], "w") as f:
            f.write(spec_hcl(names[j["id"]], j, arm, env, ctx["grace"]))

    # The arm's mode, outside the clock; each undone by the cleanup, in reverse.
    def purge_all():
        for j in trace:
            try:
                nomad.call("DELETE", f"/v1/job/{urllib.parse.quote(names[j['id']])}?purge=true")
            except urllib.error.HTTPError:
                pass
        # Wait for the arm's allocations to stop (GPUs free for the next arm), then collect them.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(not terminal(x) for x in arm_allocs(nomad, prefix)):
            time.sleep(0.5)
        try:
            nomad.call("PUT", "/v1/system/gc")
        except urllib.error.HTTPError:
            pass

    cleanup.append(purge_all)
    consul.call("DELETE", f"/v1/kv/{QUEUES_TREE}?recurse=true")
    if arm == "queue":
        def stop_controller():
            if a.logs:
                save_controller_log(nomad, os.path.join(a.logs, trial + ".controller.log"))
            try:
                nomad.call("DELETE", f"/v1/job/{CONTROLLER_JOB}?purge=true")
            except urllib.error.HTTPError:
                pass
            consul.call("DELETE", f"/v1/kv/{QUEUES_TREE}?recurse=true")
            deadline = time.monotonic() + 60
            while consul.leader_session() and time.monotonic() < deadline:
                time.sleep(0.2)
        # Stopped before the jobs are purged (cleanup runs in order): nothing is admitted meanwhile.
        cleanup.insert(0, stop_controller)
        bl.gpujob("queue", "apply", ctx["queues_file"])
        deadline = time.monotonic() + 120
        while not consul.leader_session():
            if time.monotonic() > deadline:
                raise RuntimeError("the queue controller did not lead within 120 s")
            time.sleep(0.2)
    if arm == "nomad-preempt":
        before = scheduler_batch_preemption(nomad)
        cleanup.insert(0, lambda: set_batch_preemption(nomad, before))
        set_batch_preemption(nomad, True)
    time.sleep(1)  # the watchers see the switch

    submits = {}  # id -> (Popen, log file)
    rec = {j["id"]: {"id": j["id"], "team": j["team"], "gpus": j["gpus"], "members": j["members"],
                     "per": j["per"], "dur": j["dur"] / a.time_scale, "submit": None} for j in trace}
    allocs = {}  # alloc id -> {"job", "create", "end" or None}
    done, ranks = set(), {}
    order = sorted(trace, key=lambda j: j["at"])
    nxt = 0
    last_work_at = max(j["at"] for j in trace) / a.time_scale
    total = sum(j["gpus"] * j["dur"] for j in trace) / a.time_scale
    timeout = a.arm_timeout or (last_work_at + 4 * total / ctx["gpus"] + 180)
    sig, sig_at = None, time.monotonic()
    t0 = time.time()
    cleanup.insert(0, lambda: [p.kill() for p, _ in submits.values() if p.poll() is None])
    bl.log(f"{trial}: replaying {len(trace)} jobs ({total:.0f} GPU-s of work, last arrival at "
           f"{last_work_at:.0f} s, timeout {timeout:.0f} s)")
    last_poll = 0.0
    while True:
        now = time.time()
        while nxt < len(order) and now >= t0 + order[nxt]["at"] / a.time_scale:
            j = order[nxt]
            logf = open(os.path.join(trial_dir, j["id"] + ".submit.log"), "w")
            env = dict(os.environ, BENCH_TAG=ctx["tag"], BENCH_TRIAL=trial)
            rec[j["id"]]["submit"] = time.time()
            submits[j["id"]] = (subprocess.Popen(
                [os.path.join(bl.REPO, "bin", "gpujob"), "submit", "--detach", spec_paths[j["id"]]],
                stdout=logf, stderr=subprocess.STDOUT, env=env), logf)
            nxt += 1
        for jid, (p, logf) in submits.items():
            rc = p.poll()
            if rc is not None and not logf.closed:
                logf.close()
                if rc != 0:
                    with open(logf.name) as f:
                        raise RuntimeError(f"gpujob submit of {names[jid]} exited {rc}: {f.read()[-2000:]}")
        if now - last_poll >= 0.5:
            last_poll = now
            for x in arm_allocs(nomad, prefix):
                note_alloc(allocs, x, prefix, now)
                if x.get("ClientStatus") == "failed" and x["JobID"][len(prefix):] not in done:
                    msgs = [ev.get("DisplayMessage", "") for ts in (x.get("TaskStates") or {}).values()
                            for ev in ts.get("Events") or []]
                    raise RuntimeError(f"{x['Name']} failed: {' / '.join(m for m in msgs if m)[-800:]}")
            for j in trace:
                if j["id"] in done or rec[j["id"]]["submit"] is None:
                    continue
                rk = read_ranks(os.path.join(trial_dir, j["id"]))
                ranks[j["id"]] = rk
                if len(rk) == j["gpus"] and all(any(iv[2] == "end" for iv in rk.get(r, [])) for r in range(j["gpus"])):
                    done.add(j["id"])
            if len(done) == len(trace):
                break
            s = (len(allocs), sum(1 for r in allocs.values() if r["end"]),
                 sum(len(v) for rk in ranks.values() for v in rk.values()), len(done), nxt)
            if s != sig:
                sig, sig_at = s, time.monotonic()
            elif nxt == len(order) and time.monotonic() - sig_at > max(120, 3 * 60 / a.time_scale):
                held = partial_holds(trace, done, allocs)
                why = f"nothing changed for {time.monotonic() - sig_at:.0f} s; " + describe_waiting(trace, done, allocs)
                if held:
                    raise Deadlock(f"partial gangs hold {sum(held.values())} GPUs ("
                                   + ", ".join(f"{k} {v}" for k, v in sorted(held.items())) + f"); {why}")
                raise RuntimeError("stalled: " + why)
            if now - t0 > timeout:
                raise TimeoutError(f"{len(done)} of {len(trace)} jobs ended within {timeout:.0f} s; "
                                   + describe_waiting(trace, done, allocs))
        time.sleep(0.05)
    # The last allocations' ends (the ranks have ended; the members exit).
    deadline = time.monotonic() + 15
    while True:
        now = time.time()
        xs = arm_allocs(nomad, prefix)
        for x in xs:
            note_alloc(allocs, x, prefix, now)
        if all(r["end"] is not None for r in allocs.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for r in allocs.values():
        if r["end"] is None:
            r["end"] = time.time()
    return figures(trace, rec, ranks, allocs, ctx)


def note_alloc(allocs, x, prefix, now):
    """Records allocation x (of a job named prefix + id): when it was placed, when it stopped
    holding its GPUs, whether Nomad evicted it (preemption)."""
    r = allocs.setdefault(x["ID"], {"job": x["JobID"][len(prefix):], "create": x["CreateTime"] / 1e9,
                                   "end": None, "evicted": False})
    r["evicted"] = r["evicted"] or x.get("DesiredStatus") == "evict"
    if r["end"] is None and terminal(x):
        r["end"] = release_time(x, now)


def save_controller_log(nomad, path):
    """The admission controller's log (stderr), for --logs."""
    p = subprocess.run([nomad.bin, "alloc", "logs", "-stderr", "-job", CONTROLLER_JOB],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with open(path, "wb") as f:
        f.write(p.stdout)


class Deadlock(RuntimeError):
    """Partly placed gangs hold GPUs that the rest of each needs: nothing can end (the ranks' 30 min
    rendezvous_timeout would fail them). A result of the arm, not a failure of the harness."""


def partial_holds(trace, done, allocs):
    """{job: GPUs held} of the jobs not ended that hold some but not all of their members."""
    held = {}
    for r in allocs.values():
        if r["end"] is None:
            held[r["job"]] = held.get(r["job"], 0) + 1
    return {j["id"]: held[j["id"]] * j["per"] for j in trace
            if j["id"] not in done and 0 < held.get(j["id"], 0) < j["members"]}


def describe_waiting(trace, done, allocs):
    held = {}
    for r in allocs.values():
        if r["end"] is None:
            held[r["job"]] = held.get(r["job"], 0) + 1
    left = [f"{j['id']} ({j['team']}, {j['members']}x{j['per']} GPU, {held.get(j['id'], 0)} member(s) holding)"
            for j in trace if j["id"] not in done]
    return "not ended: " + ", ".join(left[:12]) + (" ..." if len(left) > 12 else "")


# ---- figures ---------------------------------------------------------------------------------


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def idle_held(job, allocs):
    """GPU-seconds held by the job's members while 0 < members holding < members, except a whole
    gang's own stop (a stretch entered from a whole gang in which no member is placed)."""
    ev = {}
    for r in allocs:
        ev[r["create"]] = ev.get(r["create"], 0) + 1
        ev[r["end"]] = ev.get(r["end"], 0) - 1
    held, total = 0, 0.0
    seg = None  # [GPU-seconds, from_whole, rose]
    times = sorted(ev)
    for i, t in enumerate(times):
        prev = held
        held += ev[t]
        if seg is not None and ev[t] > 0:
            seg[2] = True
        partial = 0 < held < job["members"]
        if partial and seg is None:
            seg = [0.0, prev >= job["members"], False]
        if not partial and seg is not None:
            if not seg[1] or seg[2]:
                total += seg[0]
            seg = None
        if partial and i + 1 < len(times):
            seg[0] += held * job["per"] * (times[i + 1] - t)
    if seg is not None and (not seg[1] or seg[2]):
        total += seg[0]
    return total


def pct(values, p):
    s = sorted(values)
    return s[max(0, math.ceil(len(s) * p / 100) - 1)]


def figures(trace, rec, ranks, allocs, ctx):
    jobs_out = []
    rank_iv = {}  # id -> [(start, end)]
    by_job = {}
    for r in allocs.values():
        by_job.setdefault(r["job"], []).append(r)
    for j in trace:
        rk = ranks.get(j["id"], {})
        ivs = []
        for lst in rk.values():
            for start, end, _how, mtime in lst:
                ivs.append((start, end if end is not None else max(start, mtime)))
        rank_iv[j["id"]] = ivs
        first = {r: min(iv[0] for iv in lst) for r, lst in rk.items()}
        r0 = rec[j["id"]]
        r0["first_placed"] = min((x["create"] for x in by_job.get(j["id"], [])), default=None)
        r0["gang_complete"] = max(first.values()) if first else None
        r0["end"] = max(iv[1] for iv in ivs) if ivs else None
        r0["restarts"] = max(0, len(rk.get(0, [])) - 1)
        r0["idle_held"] = idle_held(j, by_job.get(j["id"], []))
        jobs_out.append(r0)
    start = min(r["submit"] for r in jobs_out)
    end = max(r["end"] for r in jobs_out)
    makespan = end - start
    busy = sum(e - s for ivs in rank_iv.values() for s, e in ivs)  # 1 GPU per rank
    jcts = [r["end"] - r["submit"] for r in jobs_out]
    waits = [r["gang_complete"] - r["submit"] for r in jobs_out]

    # Sweep: per team, jobs waiting (submitted, not running, not ended) and GPUs busy.
    events = []  # (time, team, d_waiting, d_busy)
    for j in trace:
        r, team = rec[j["id"]], j["team"]
        events.append((r["submit"], team, 1, 0))
        events.append((r["end"], team, -1, 0))
        for s, e in union(rank_iv[j["id"]]):
            events.append((s, team, -1, 0))
            events.append((e, team, 1, 0))
        for s, e in rank_iv[j["id"]]:
            events.append((s, team, 0, 1))
            events.append((e, team, 0, -1))
    events.sort(key=lambda x: x[0])
    teams = [t for t, _ in TEAMS]
    waiting = {t: 0 for t in teams}
    busy_now = {t: 0 for t in teams}
    contended = {t: 0.0 for t in teams}
    wait_secs = wait_busy = 0.0
    for i, (t, team, dw, db) in enumerate(events):
        waiting[team] += dw
        busy_now[team] += db
        if i + 1 < len(events):
            dt = events[i + 1][0] - t
            if dt <= 0:
                continue
            if any(waiting[x] > 0 for x in teams):
                wait_secs += dt
                wait_busy += sum(busy_now.values()) * dt
            if all(waiting[x] > 0 for x in teams):
                for x in teams:
                    contended[x] += busy_now[x] * dt
    csum = sum(contended.values())
    fig = {
        "utilisation": busy / (ctx["gpus"] * makespan),
        "util_waiting": wait_busy / (ctx["gpus"] * wait_secs) if wait_secs else None,
        "mean_jct": sum(jcts) / len(jcts),
        "p95_jct": pct(jcts, 95),
        "makespan": makespan,
        "idle_held": sum(r["idle_held"] for r in jobs_out),
        "restarted": sum(1 for r in jobs_out if r["restarts"]),
        "evicted": sum(1 for r in allocs.values() if r["evicted"]),
        "mean_wait": sum(waits) / len(waits),
        "contended_s": csum,
    }
    for x in teams:
        fig[f"share_{x}"] = contended[x] / csum if csum else None
    for r in jobs_out:  # relative to the first submission, for the timeline file
        for k in ("submit", "first_placed", "gang_complete", "end"):
            if r[k] is not None:
                r[k] = round(r[k] - start, 3)
        r["idle_held"] = round(r["idle_held"], 3)
    return fig, jobs_out


# ---- report ----------------------------------------------------------------------------------


def cell(s, digits, scale, unit):
    if s["n"] == 0:
        return "-"
    fail = f"; {s['n']} of {s['n'] + s['failed']} runs" if s["failed"] else ""
    u = f" {unit}" if unit and unit != "%" else ("%" if unit == "%" else "")
    f = f"{{:.{digits}f}}"
    return (f"{f.format(s['median'] * scale)}{u} ({f.format(s['min'] * scale)}-{f.format(s['max'] * scale)}"
            f"{fail})")


def targets(summ, arms, weights):
    """[(arm, [(target, (value text, met or None))])] for the arms other than the anchor, the same
    rows for each ("-" where the figures are missing)."""
    out = []
    anc = summ.get(ANCHOR)
    for arm in arms:
        if arm == ANCHOR:
            continue
        s = summ[arm]
        rows = []
        ih = s["idle_held"]
        rows.append(("GPU-s held idle by partial gangs = 0 (every run)",
                     (f"max {ih['max']:.1f}", ih["max"] < 0.05) if ih["n"] else ("-", None)))
        both = anc and anc["utilisation"]["n"] and s["utilisation"]["n"]
        d = (s["utilisation"]["median"] - anc["utilisation"]["median"]) * 100 if both else None
        rows.append(("utilisation >= plain Nomad's + 10 points",
                     (f"{d:+.1f} points", d >= 10 - 1e-9) if both else ("-", None)))
        r = s["p95_jct"]["median"] / anc["p95_jct"]["median"] if both else None
        rows.append(("p95 JCT <= 0.8x plain Nomad's", (f"{r:.2f}x", r <= 0.8 + 1e-9) if both else ("-", None)))
        for team, w in weights.items():
            sh = s[f"share_{team}"]
            dev = sh["median"] / w - 1 if sh["n"] else None
            rows.append((f"{team} share within 10 % of its weight {w:.3f}",
                         (f"{sh['median']:.3f} ({dev:+.0%})", abs(dev) <= 0.10 + 1e-9) if sh["n"] else ("-", None)))
        out.append((arm, rows))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--runs", type=int, default=5, help="replays of the trace per arm, interleaved (5)")
    ap.add_argument("--jobs", type=int, default=40, help="jobs in the trace (40)")
    ap.add_argument("--seed", type=int, default=1, help="the trace's seed (1)")
    ap.add_argument("--load", type=float, default=1.5, help="offered load (GPU-s asked per GPU-s); default 1.5")
    ap.add_argument("--sizes", default=DEFAULT_SIZES,
                    help=f"GPUS:WEIGHT,... ({DEFAULT_SIZES}; the simulator's Philly shape: {PHILLY_SIZES})")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="divide run times and arrival gaps by this (smoke runs; figures only for 1)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"from {ARMS}")
    ap.add_argument("--arm-timeout", type=float, default=0, help="seconds per arm (default: from the trace)")
    ap.add_argument("--grace", type=int, default=10, help="checkpoint_grace of the jobs, seconds (10)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--timeline", help="write every job's submit, first placed, gang complete and end here")
    ap.add_argument("--logs", help="save each queue arm's admission controller log in this directory")
    ap.add_argument("--print-trace", action="store_true",
                    help="print the trace a cluster of 3 x 4 GPUs gets (scale 1), one JSON line a job, and exit")
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    if a.runs < 1 or a.jobs < 1 or a.time_scale <= 0 or a.load <= 0 or not arms or any(x not in ARMS for x in arms):
        ap.error(f"--runs >= 1, --jobs >= 1, --time-scale > 0, --load > 0, --arms from {ARMS}")
    try:
        sizes = parse_sizes(a.sizes)
    except ValueError as e:
        ap.error(str(e))
    if a.print_trace:
        trace, work = make_trace(a.seed, a.jobs, 12, 4, a.load, sizes)
        for j in trace:
            print(json.dumps(j))
        return 0

    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    bl.exit_on_signals()
    nomad, consul = bl.Nomad(), bl.Consul()
    gpus, per_node = cluster_gpus(nomad)
    trace, work = make_trace(a.seed, a.jobs, gpus, per_node, a.load, sizes)
    q = quotas(gpus)
    wsum = sum(w for _, w in TEAMS)
    weights = {t: w / wsum for t, w in TEAMS}
    tag = bl.new_tag("bench-replay")
    results = {arm: [] for arm in arms}
    outcomes = {arm: [] for arm in arms}  # per run: "completed", "deadlocked: ...", "failed: ..."
    raw = {arm: {k: [] for k, *_ in METRICS} for arm in arms}
    timeline = []
    bl.log(f"cluster: {gpus} GPUs ({per_node} per node); quotas {q}; trace: {len(trace)} jobs, "
           f"{work:.0f} GPU-s at scale 1, last arrival {trace[-1]['at']:.0f} s, load {a.load}")
    with bl.scratch_dir(tag) as scratch:
        os.chmod(scratch, 0o755)
        rank_py = os.path.join(scratch, "rank.py")
        with open(rank_py, "w") as f:
            f.write(RANK)
        os.chmod(rank_py, 0o644)
        queues_file = os.path.join(scratch, "queues.hcl")
        with open(queues_file, "w") as f:
            for name, w in TEAMS:
                f.write(f'queue "{name}" {{\n  gpus   = {q[name]}\n  weight = {w:g}\n  borrow = true\n'
                        f'  cohort = "replay"\n}}\n')
        ctx = {"tag": tag, "rank_py": rank_py, "queues_file": queues_file, "gpus": gpus,
               "grace": a.grace}
        before = scheduler_batch_preemption(nomad)
        try:
            for i in range(a.runs):
                for arm in bl.rotated(arms, i):
                    trial = f"{tag}-{arm}-{i}"
                    box = {}

                    def measure(cleanup, arm=arm, trial=trial, box=box):
                        try:
                            box["fig"], box["jobs"] = replay(nomad, consul, a, ctx, trial, arm, trace, scratch,
                                                             cleanup)
                        except Exception as e:
                            box["error"] = e
                            raise
                        return box["fig"]["makespan"]

                    bl.run_trial(f"run {i + 1}/{a.runs} {arm} (makespan)", trial, measure)
                    fig = box.get("fig")
                    results[arm].append(fig)
                    err = box.get("error")
                    outcomes[arm].append("completed" if fig else
                                         f"{'deadlocked' if isinstance(err, Deadlock) else 'failed'}: {err}")
                    for k, *_ in METRICS:
                        raw[arm][k].append(None if fig is None else fig.get(k))
                    if fig:
                        bl.log(f"run {i + 1}/{a.runs} {arm}: " + ", ".join(
                            f"{k} {fig[k]:.3g}" for k, *_ in METRICS if fig.get(k) is not None))
                        timeline.append({"run": i, "arm": arm, "jobs": box["jobs"]})
        finally:
            if "nomad-preempt" in arms and scheduler_batch_preemption(nomad) != before:
                set_batch_preemption(nomad, before)
            if "queue" in arms:
                try:
                    nomad.call("DELETE", f"/v1/job/{CONTROLLER_JOB}?purge=true")
                except (urllib.error.HTTPError, OSError):
                    pass
            consul.call("DELETE", f"/v1/kv/{QUEUES_TREE}?recurse=true")

    summ = {arm: {k: bl.summary(raw[arm][k]) for k, *_ in METRICS} for arm in arms}
    scale_note = "" if a.time_scale == 1 else (f" AT --time-scale {a.time_scale:g}: a smoke run, "
                                               "not figures")
    print(f"\nTrace replay{scale_note}: {len(trace)} jobs (seed {a.seed}, load {a.load:g}, "
          f"{work / a.time_scale:.0f} GPU-s of work), {gpus} GPUs ({gpus // per_node} x {per_node}), teams "
          + ", ".join(f"{t} weight {w:g} quota {q[t]}" for t, w in TEAMS)
          + f"; median (min-max) of {a.runs} interleaved runs:\n")
    labels = {"queue": "gpujob queue", "nomad": "plain Nomad (anchor)", "nomad-preempt": "Nomad + batch preemption"}
    print("| | " + " | ".join(labels[x] for x in arms) + " |")
    print("| --- |" + " --- |" * len(arms))

    def runs_cell(arm):
        dl = sum(1 for o in outcomes[arm] if o.startswith("deadlocked"))
        fl = sum(1 for o in outcomes[arm] if o.startswith("failed"))
        extra = ", ".join(x for x in (f"{dl} deadlocked" if dl else "", f"{fl} failed" if fl else "") if x)
        return f"{len(outcomes[arm]) - dl - fl} of {len(outcomes[arm])}" + (f" ({extra})" if extra else "")
    print("| runs that completed every job | " + " | ".join(runs_cell(x) for x in arms) + " |")
    for k, label, unit, digits, scale in METRICS:
        if k.startswith("share_"):
            label += f" (weight {weights[k[6:]]:.3f})"
        print(f"| {label} | " + " | ".join(cell(summ[x][k], digits, scale, unit) for x in arms) + " |")
    for arm in arms:
        for i, o in enumerate(outcomes[arm]):
            if o != "completed":
                print(f"\n{labels[arm]}, run {i + 1}: {o[:600]}")
    tg = targets(summ, arms, weights)
    if tg:
        print("\nTargets (issue 25), against plain Nomad's medians; shares: |share / weight - 1| <= 0.10:\n")
        names = [x for x, _ in tg]
        print("| target | " + " | ".join(labels[x] for x in names) + " |")
        print("| --- |" + " --- |" * len(names))
        for r in range(len(tg[0][1])):
            row = [tg[0][1][r][0]]
            for _, rows in tg:
                v, met = rows[r][1]
                row.append(v if met is None else f"{v}: " + ("met" if met else "NOT met"))
            print("| " + " | ".join(row) + " |")
    if a.timeline:
        with open(a.timeline, "w") as f:
            json.dump({"trace": trace, "runs": timeline}, f)
    bl.emit({"bench": "queue-replay", "runs": a.runs, "jobs": len(trace), "seed": a.seed, "load": a.load,
             "sizes": a.sizes, "time_scale": a.time_scale, "gpus": gpus, "gpus_per_node": per_node,
             "quotas": q, "weights": weights, "anchor": ANCHOR, "outcomes": outcomes, "raw": raw, "summary": summ,
             "targets": {arm: [{"target": t, "value": v, "met": m} for t, (v, m) in rows] for arm, rows in tg}},
            a.json)
    # A deadlocked run is a result (plain Nomad's partial gangs holding what each other needs); any
    # other failure is the harness's.
    return 0 if all(not o.startswith("failed") for x in arms for o in outcomes[x]) else 1


if __name__ == "__main__":
    sys.exit(main())
