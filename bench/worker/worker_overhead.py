#!/usr/bin/env python3
"""Worker path overhead (issue 5): tokens/s of one training job run through
depthbench-scheduler + depthbench-worker vs the same depthbench-train run
alone, alternated in one run (A B A B ...), so machine load drifts hit both.

Throughput is measured end to end as the consumer sees it: tokens trained
between step `--skip` and the last step, divided by the time between the
arrival of those two step events (the standalone run: when this script read
the lines from the trainer's stdout; the worker path: the wall_ms the worker
stamped on the points when it read them from its child). That includes any
stall the reader causes (pipe back-pressure, relay), which the trainer's own
per-step tokens_per_s would not show. The two paths run the identical config
(same threads, seed, data, steps); --resume is irrelevant (fresh dirs).

  python3 bench/worker/worker_overhead.py --build build [--pairs 3] [--steps 150]

Also prints the CPU time the scheduler and worker daemons spent during each
worker-path job (/proc/PID/stat) as a share of the standalone trainer's CPU
time (getrusage of children): the path's cost in work rather than in a
wall-clock rate that machine noise moves by more than the 2% goal.

Prints one line per run and a summary; exits 0.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def config(args):
    return {
        "arch": "pre_ln", "layers": args.layers, "d_model": args.d_model, "heads": 4,
        "vocab": 256, "seq_len": args.seq_len, "batch": args.batch, "steps": args.steps,
        "lr": 3e-3, "seed": 0, "threads": args.threads, "data": "brown",
        "eval_batches": 2, "log_interval": 1,
    }


def standalone(args, work, i):
    cfg_path = os.path.join(work, f"alone-{i}.json")
    with open(cfg_path, "w") as f:
        json.dump(config(args), f)
    out = os.path.join(work, f"alone-{i}")
    proc = subprocess.Popen(
        [args.train, "train", "--config", cfg_path, "--out", out, "--resume"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    t = {}
    for line in proc.stdout:
        now = time.time()
        ev = json.loads(line)
        if ev.get("event") == "step":
            t[ev["step"]] = now
    rc = proc.wait()
    assert rc == 0, f"standalone run exited {rc}"
    return t


def through_worker(args, work, i, address):
    spec = {
        "name": f"bench-{i}",
        "architectures": ["pre_ln"],
        "shapes": {"explicit": [{"layers": args.layers, "d_model": args.d_model,
                                 "heads": 4, "vocab": 256}]},
        "lr_grids": {"pre_ln": [3e-3]},
        "seeds": [0],
        "training": {"data": "brown", "seq_len": args.seq_len, "batch": args.batch,
                     "steps": args.steps, "eval_batches": 2, "log_interval": 1},
    }
    spec_path = os.path.join(work, f"spec-{i}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    subprocess.run([args.cli, "--scheduler", address, "submit", spec_path], check=True,
                   stdout=subprocess.DEVNULL)
    # One blocking WatchJob stream waits for the job and returns its points
    # (polling `depthbench status` would start a CLI process several times a
    # second beside the trainer and bill that to the worker path). Points
    # come through the API: the scheduler holds its SQLite file in exclusive
    # locking mode.
    jobs = json.loads(subprocess.run(
        [args.cli, "--scheduler", address, "--json", "jobs", "--sweep", f"bench-{i}"],
        check=True, capture_output=True, text=True).stdout)
    job_list = jobs["jobs"] if isinstance(jobs, dict) else jobs
    assert len(job_list) == 1, f"expected one job, got {job_list}"
    job_id = str(job_list[0]["id"])
    watch = subprocess.run(
        [args.cli, "--scheduler", address, "--json", "watch", job_id, "--timeout-s", "900"],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in watch.splitlines():
        ev = json.loads(line)
        point = ev.get("point")
        if point and point.get("name") == "loss":
            rows.append((int(point["step"]), int(point.get("wallMs", point.get("wall_ms", 0)))))
    assert len(rows) == args.steps, f"worker path stored {len(rows)} loss points"
    return {step: wall_ms / 1000.0 for step, wall_ms in rows}


def tokens_per_s(args, t):
    first, last = args.skip, args.steps
    return (last - first) * args.batch * args.seq_len / (t[last] - t[first])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--skip", type=int, default=10, help="warm-up steps excluded")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    b = os.path.abspath(args.build)
    args.train = f"{b}/trainer_core/depthbench-train"
    args.cli = f"{b}/cli/depthbench"
    scheduler_bin = f"{b}/scheduler/depthbench-scheduler"
    worker_bin = f"{b}/worker/depthbench-worker"

    work = tempfile.mkdtemp(prefix="depthbench-worker-bench-")
    db = os.path.join(work, "bench.sqlite")
    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "daemons.log"), "w")
    sched = subprocess.Popen([scheduler_bin, "--db", db, "--listen", "127.0.0.1:0",
                              "--port-file", port_file], stdout=log, stderr=log)
    while not os.path.exists(port_file):
        time.sleep(0.02)
    address = "127.0.0.1:" + open(port_file).read().strip()
    worker = subprocess.Popen([worker_bin, "--scheduler", address, "--checkpoint-root",
                               os.path.join(work, "ckpt"), "--slots", "1",
                               "--threads-per-slot", str(args.threads), "--name", "bench",
                               "--train-binary", args.train, "--poll-ms", "100"],
                              stdout=log, stderr=log)
    def cpu_s(proc):
        # utime + stime of a daemon (/proc/PID/stat fields 14-15), seconds.
        fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def children_cpu_s():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    alone, worker_path, cpu_share = [], [], []
    try:
        for i in range(args.pairs):
            c0 = children_cpu_s()
            a = tokens_per_s(args, standalone(args, work, i))
            trainer_cpu = children_cpu_s() - c0
            d0 = cpu_s(sched) + cpu_s(worker)
            w = tokens_per_s(args, through_worker(args, work, i, address))
            daemons_cpu = cpu_s(sched) + cpu_s(worker) - d0
            alone.append(a)
            worker_path.append(w)
            cpu_share.append(daemons_cpu / trainer_cpu)
            print(f"pair {i}: alone {a:9.0f} tok/s   worker path {w:9.0f} tok/s   "
                  f"ratio {w / a:.4f}   scheduler+worker CPU {daemons_cpu:.2f} s "
                  f"= {100 * cpu_share[-1]:.2f}% of the trainer's {trainer_cpu:.1f} s",
                  flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        sched.send_signal(signal.SIGTERM)
        sched.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    ma, mw = statistics.median(alone), statistics.median(worker_path)
    ratios = [w / a for a, w in zip(alone, worker_path)]
    print(f"median alone {ma:.0f} tok/s, worker path {mw:.0f} tok/s; "
          f"overhead {100 * (1 - mw / ma):+.2f}% (median of pair ratios "
          f"{statistics.median(ratios):.4f}, range {min(ratios):.4f}..{max(ratios):.4f})")
    print(f"scheduler + worker CPU per job: median {100 * statistics.median(cpu_share):.2f}% "
          f"of the trainer's own CPU time (the CLI's submit/jobs/watch calls excluded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
