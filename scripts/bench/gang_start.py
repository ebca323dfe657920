#!/usr/bin/python3
"""Gang start: `nomad job run` -> every process of N members running, gpujob vs raw_exec.

One Nomad job per trial: one group of count = N, the same network block (one dynamic port
"rdzv") and the same CPU-only resources for both drivers; its task runs

    /bin/sh -c 'date +%s.%N > $BENCH_DIR/$NOMAD_ALLOC_ID; exec sleep 300'

directly under raw_exec, or as the single rank (nproc_per_node = 1) of a gpujob member, which
starts it only once all N members have met in the Consul rendezvous; gpujob-docker is a gpujob
container member (a `train` spec with `image`): the supervisor and the rank run in a container of
the image scripts/build-train-image.sh builds, started by Nomad's docker driver, beside the
gpujob sidecar that prepares it. The image has no `date`, so `--task python` has every driver
write the timestamp from `python3 -S` instead (compare gpujob-docker with gpujob that way). The figure is the time
from just before `nomad job run -detach` is executed to the last of the N timestamps. The job
is then stopped and purged, and the next trial starts only once every process of this one is
gone. Each run measures every N with both drivers, in an order rotated by the run number.

Run it through the wrapper (which starts and stops the dev cluster):

    scripts/bench/gang-start.sh [--runs 5] [--n 2,8,16]
    scripts/bench/gang-start.sh --runs 5 --n 2,8 --drivers gpujob-docker,gpujob --task python
"""
import argparse
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import benchlib as bl  # noqa: E402

DRIVERS = ["gpujob", "raw_exec", "gpujob-docker"]
TASK = 'date +%s.%N > "$BENCH_DIR/$NOMAD_ALLOC_ID"; exec sleep 300'
TASK_PY = ("import os,time; f=os.environ['BENCH_DIR']+'/'+os.environ['NOMAD_ALLOC_ID']; "
           "open(f+'.tmp','w').write(repr(time.time())); os.rename(f+'.tmp',f); time.sleep(300)")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def command(task):
    if task == "python":
        return "/usr/bin/python3", ["-S", "-c", TASK_PY]
    return "/bin/sh", ["-c", TASK]


def docker_job_hcl(job, n, env, image, out_dir, task):
    """A gpujob container member per allocation, as `gpujob render` writes one for a train
    spec with image (jobspecs/rendered/bert-image.nomad.hcl), with the scratch dir mounted."""
    cmd, args = command(task)
    envs = "\n".join(f"        {k} = {bl.hcl_str(v)}" for k, v in env.items())
    root = os.environ["GPUJOB_CHECKPOINT_ROOT"]
    return bl.one_shot_group_hcl(job, "g", n, f"""    task "gpujob" {{
      driver = "gpujob"
      lifecycle {{
        hook    = "prestart"
        sidecar = true
      }}
      config {{
        command         = {bl.hcl_str(cmd)}
        args            = {bl.hcl_list(args)}
        nproc_per_node  = 1
        max_restarts    = 0
        container_task  = "t"
        checkpoint_root = {bl.hcl_str(root)}
        rendezvous {{
          nnodes       = "{n}"
          port         = "rdzv"
          join_timeout = "2m"
        }}
      }}
      resources {{
        cpu    = 20
        memory = 64
      }}
    }}
    task "t" {{
      driver = "docker"
      user   = "0"
      config {{
        image        = {bl.hcl_str(image)}
        entrypoint   = ["/gpujob/supervisor", "/gpujob/spec.json"]
        network_mode = "host"
        init         = true
        mount {{
          type     = "bind"
          source   = "/run/gpujob/${{NOMAD_ALLOC_ID}}"
          target   = "/gpujob"
          readonly = true
        }}
        mount {{
          type   = "bind"
          source = "{root}/${{NOMAD_NAMESPACE}}/${{NOMAD_JOB_ID}}"
          target = "{root}/${{NOMAD_NAMESPACE}}/${{NOMAD_JOB_ID}}"
        }}
        mount {{
          type   = "bind"
          source = {bl.hcl_str(out_dir)}
          target = {bl.hcl_str(out_dir)}
        }}
      }}
      env {{
{envs}
      }}
      resources {{
        cpu    = 20
        memory = 128
      }}
    }}""")


def job_hcl(job, driver, n, env, image=None, out_dir=None, task="sh"):
    if driver == "gpujob-docker":
        return docker_job_hcl(job, n, env, image, out_dir, task)
    cmd, args = command(task)
    if driver == "gpujob":
        config = f"""        command        = {bl.hcl_str(cmd)}
        args           = {bl.hcl_list(args)}
        nproc_per_node = 1
        max_restarts   = 0
        rendezvous {{
          nnodes       = "{n}"
          port         = "rdzv"
          join_timeout = "2m"
        }}"""
    else:
        config = f"""        command = {bl.hcl_str(cmd)}
        args    = {bl.hcl_list(args)}"""
    return bl.one_shot_job_hcl(job, "g", "t", n, driver, config, env, cpu=20, memory=64)


def one(nomad, a, tag, trial, driver, n, out_dir, cleanup):
    env = {"BENCH_TAG": tag, "BENCH_TRIAL": trial, "BENCH_DIR": out_dir}
    hcl = job_hcl(trial, driver, n, env, a.image, out_dir, a.task)
    cleanup.append(lambda: nomad.stop(trial))
    t0 = time.time()
    nomad.run(hcl)
    deadline = time.monotonic() + a.timeout
    last_check = 0.0
    while True:
        names = [x for x in os.listdir(out_dir) if not x.endswith(".tmp")]
        if len(names) >= n:
            stamps = []
            for name in names:
                with open(os.path.join(out_dir, name)) as f:
                    text = f.read().strip()
                if not text:  # written but not yet flushed
                    break
                stamps.append(float(text))
            if len(stamps) == n:
                return max(stamps) - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(names)} of {n} processes started after {a.timeout}s")
        if time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            failed = nomad.failed_allocs(trial)
            if failed:
                raise RuntimeError(f"{len(failed)} allocation(s) failed, e.g. "
                                   f"{failed[0].get('TaskStates')}")
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", default="2,8,16", help="member counts, comma separated")
    ap.add_argument("--drivers", default="gpujob,raw_exec",
                    help=f"from {DRIVERS}; gpujob-docker needs the cluster started with GPUJOB_DEV_DOCKER=1 "
                         "(gang-start.sh does that when it is listed)")
    ap.add_argument("--task", choices=["sh", "python"], default="sh",
                    help="what each process runs to write its timestamp (the image has no date: python)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    ns = [int(x) for x in a.n.split(",") if x]
    drivers = [d for d in a.drivers.split(",") if d]
    if a.runs < 1 or not ns or min(ns) < 1 or any(d not in DRIVERS for d in drivers):
        ap.error(f"--runs >= 1, --n a list of counts >= 1, --drivers from {DRIVERS}")
    bl.exit_on_signals()
    a.image = None
    if "gpujob-docker" in drivers:
        if a.task != "python":
            ap.error("gpujob-docker needs --task python (the image has no date)")
        a.image = subprocess.run([os.path.join(REPO, "scripts", "build-train-image.sh")], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    nomad = bl.Nomad()
    tag = bl.new_tag("bench-gang")
    figures = {(d, n): [] for n in ns for d in drivers}
    with bl.scratch_dir(tag) as scratch:
        os.chmod(scratch, 0o755)
        for i in range(a.runs):
            for n in ns:
                for driver in bl.rotated(drivers, i):
                    trial = f"{tag}-{driver.replace('_', '-')}-{n}-{i}"
                    out_dir = os.path.join(scratch, trial)
                    os.makedirs(out_dir)
                    os.chmod(out_dir, 0o777)
                    v = bl.run_trial(
                        f"run {i + 1}/{a.runs} N={n} {driver}", trial,
                        lambda cleanup: one(nomad, a, tag, trial, driver, n, out_dir, cleanup))
                    figures[(driver, n)].append(v)

    print(f"\nGang start: `nomad job run` -> every process of N members running "
          f"(median (min-max) of {a.runs} interleaved runs):\n")
    pair = drivers[:2] if len(drivers) == 2 else None
    print(f"| N | " + " | ".join(drivers) + (f" | {pair[0]} - {pair[1]} (medians) |" if pair else " |"))
    print("| --- |" + " --- |" * (len(drivers) + (pair is not None)))
    rows = []
    for n in ns:
        s = {d: bl.summary(figures[(d, n)]) for d in drivers}
        cells = [bl.fmt(s[d]) for d in drivers]
        if pair:
            g, r = s[pair[0]], s[pair[1]]
            if g["n"] and r["n"]:
                d = g["median"] - r["median"]
                if pair == ["gpujob", "raw_exec"]:
                    cells.append(f"{d:+.2f} s (target <= +0.5 s: {'met' if d <= 0.5 else 'NOT met'})")
                else:
                    cells.append(f"{d:+.2f} s")
            else:
                cells.append("-")
        print(f"| {n} | " + " | ".join(cells) + " |")
        rows.append({"n": n, "raw": {d: figures[(d, n)] for d in drivers}, "summary": s})
    out = {"bench": "gang-start", "runs": a.runs, "task": a.task, "image": a.image, "rows": rows}
    bl.emit(out, a.json)
    return 0 if bl.all_succeeded(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
