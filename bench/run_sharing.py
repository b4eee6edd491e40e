#!/usr/bin/env python3
"""Sharing as tenants see it, on this host's GPU: unchanged PyTorch guests, each through its own
forwarder, started together.

A guest's throughput share is its rate beside the others divided by its rate alone (through
vmgpu).  Weighted guests share what the GPU gives them all, which may be more or less than one
guest alone gets (overlap gains, hand-overs cost), so their shares are compared with their
weights as parts of the whole: share_i / sum(share_j) against w_i / sum(w_j) ("normalised");
the shares themselves are printed too.  A cap is an absolute share of one guest alone.  The
aggregate (the sum of the shares) is compared with references measured in the same run: two
native trainers side by side with no control, the same guests through vmgpu with --no-sched,
and natively under MPS with the same shares as active-thread percentages (what users would
pick instead).

Scenarios (trainer: ResNet-50 training at batch 32 without autotuning; inference: batch-1
ResNet-50, requests arriving --rate times a second, latency from arrival):
  weights   two trainers at weights 30/70 (the weighted policy), and four at 10/20/30/40
  nosched   the same two through vmgpu with --no-sched; natively with no control
  mps       the same two natively under MPS, 30/70 active-thread percentages, and through vmgpu
            with their forwarders' workers clients of the same MPS server (--mps, --mps-threads;
            the native policy: no turns)
  mpssame   natively under MPS at the thread limits that deliver the weights' tenant shares (parts
            30/70; limits of 30/70 give two trainers near 35/65): found from the splits measured,
            each guest's speed taken as a power of its limit, in up to two more windows; the
            aggregate against it is the comparison at the same shares (..._same_shares), kept
            only where a split's parts came within 2 pp of 30/70; and MPS's total at each shared
            row's own parts, on the line between the splits measured either side of them
            (..._equal_parts: the pair's total follows the light guest's part, so a row 2 pp
            from 30/70 is compared with what MPS gives there; none outside the parts measured)
  shared    the same two through vmgpu at weights 30/70 under the shared policy (side by side,
            held back by vmgpu/share_control.py, run here as vmgpud runs it), with their workers
            clients of one MPS server, and without MPS (the driver's own time slicing); measured
            after --shared-lead seconds (8) of the controller at work; on MPS again with the
            light guest's MPS client priority below normal and the other's normal (sharedbelow);
            where the weights rows are skipped, their references no-sched and native MPS (30/70,
            or each --mps-refs split) are run for the shared rows alone (refs)
  priority  inference (priority high) beside a trainer (normal): the inference guest's p99
            beside the trainer over its p99 alone, and the trainer's share against 80% of what
            the inference guest left (1 - its busy share alone); again under shared on MPS
            (sharedprio), side by side, the trainer's work waiting while the inference guest's goes,
            with the forwarders' MPS client priorities and without, and with the trainer's
            --yield-depth at each of --yield-depths (--prio-runs times each); and with the share
            controller on the sms lever, the trainer on the SMs the inference guest's weight leaves
            (the priority reserve), at each of --prio-reserve weights of the inference guest
            (--prio-runs times, each run after the first after a window of the inference guest
            alone, and the p99 of all their requests against that of all the alone windows'); with
            --prio-native the same pair natively on MPS, the trainer on the rest of the threads
  cap       one trainer capped at 10%, then at 50%, alone on the card: its rate over its rate alone in
            the same process (its cap lifted live after the capped window, and a second window run),
            its cap held by vmgpu/cap_control.py as vmgpud runs it (a share of its progress; measured
            after --cap-lead seconds, 36, of the controller at work), and by time alone (cap% of each
            period, as the forwarders hold it without vmgpud: cap_err_pp_time)
  converge  two trainers at 50/50 turned to 20/80 live: how long until the GPU-time shares on
            the scheduler's page are within 2 pp of the new weights (in a 250 ms window, and from
            then on to the end)
  reclaim   a trainer beside one that stops: how long from the other's last GPU time until the
            first holds the GPU (the page, sampled every millisecond)
  slowalone (where weights are skipped, on MPS, each --lever) three trainers under shared at
            30/70/10 after the controller's lead, the 10 honest and then, as new guests, going
            slow whenever it runs alone (--slow-alone, 0.3 of its speed: a probe reads it short):
            its part of the three both ways, and the others' rates beside it slow over honest
  offspan   (where weights are skipped, on MPS, each --lever) as slowalone, the 10 with a stream
            capture open on a stream of its own (torch_train.py --open-capture), which keeps its
            work off its SM span and has every guest held by time: its part both ways, the
            others' rates over honest, and the three's total over honest (off_span_total)
  aloneend  the trainer alone again at the run's end, through vmgpu and natively, over its rates
            alone at the start, which every share and aggregate is over (alone_end_ratio,
            native_alone_end_ratio): a ratio that claims less than their drift says nothing
  turns     (--alone-turns N) the inference guest alone through vmgpu and natively by turns, with
            each window's slow requests and the host's CPU steal: where the GPU host is itself a
            virtual machine, its hypervisor's steal slows every window's CPU side, vmgpu's or not

Each priority and alone window's row is followed by the host's CPUs its hypervisor held meanwhile
(steal, from /proc/stat), so that a slow window can be told from a slow host.

    python3 bench/run_sharing.py [--seconds 10] [--rate 40] [--depth N]
Last line: `sharing share_max_err_pp=… aggregate_vs_native=… aggregate_vs_nosched=…
aggregate_vs_mps=… hp_p99_ratio=… hp_trainer_vs_target=… cap_err_pp=… converge_s=… reclaim_ms=…`.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import queue
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from vmgpu import cap_control, share_control  # noqa: E402
from vmgpu.forwarder import Forwarder, guest_env  # noqa: E402
from vmgpu.sched import Page  # noqa: E402

TRAIN = ["torch_train.py", "--batch", "32", "--no-autotune"]
PROBE: dict[str, float | bool] = {}  # the share controller's probe settings (--probe, --lone-probes)
CAP_PROBE: dict[str, float] = {}  # the cap controller's probe settings (--cap-probe)
SHARED_LEAD = [8.0]  # seconds the shared pair runs before it is measured (--shared-lead)
CAP_LEAD = [36.0]  # seconds a guest capped under the cap controller runs before it is measured (--cap-lead)
CAP_TRAIN = [*TRAIN]  # the trainer of the cap rows (--cap-train)
CAP_RUNS = [1]  # each cap's controller row this many times, its error that of their mean (--cap-runs)
CAPS = [10, 50]  # the caps the cap rows hold a trainer to (--caps)
SKIP: set[str] = set()  # the scenarios --skip leaves out
PRIO_RUNS = [1]  # how many times the sharedprio scenario runs each way (--prio-runs)
MPS_REFS: list[tuple[int, int]] = [(30, 70)]  # the native MPS references of the shared rows: light/heavy (--mps-refs)
SHARED_THREADS: list[tuple[int, int]] = []  # the shared pair again on MPS partitions: light/heavy (--shared-threads)
YIELD_DEPTHS: list[int] = []  # the sharedprio scenario again with the forwarders' --yield-depth at each
CLIENT_PRIO_OFF = [True]  # the sharedprio scenario also without the forwarders' MPS client priorities
PRIO_RESERVE: list[int] = []  # the priority scenario on SM spans, the inference guest's weight at each (--prio-reserve)
OVERLAP = [share_control.OVERLAP]  # under smsover: how far each span reaches into its neighbours' (--overlap)
LEVERS = ["time"]  # how the share controller holds a guest back, each in its own shared rows (--lever)
OWN_ALONE = [5.0]  # seconds each shared guest runs alone after the window, in its own process (--own-alone)
SLOW_ALONE = [0.3]  # the part of its speed the hostile guest of the slowalone rows goes at alone (--slow-alone)
OWN_SETTLE_S = 1.0  # between one guest's window alone and the next: the first one's exit is over
INFER = ["torch_infer.py"]


def host_steal() -> tuple[float, float]:
    """The CPU seconds this host's hypervisor has taken from its CPUs so far (steal: /proc/stat's
    eighth cpu field; 0 on bare metal), and the monotonic time now."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else 0
    except (OSError, ValueError):
        ticks = 0
    return ticks / os.sysconf("SC_CLK_TCK"), time.monotonic()


def steal_cpus(before: tuple[float, float], after: tuple[float, float]) -> float:
    """How many of the host's CPUs its hypervisor held on average between two host_steal()s."""
    return (after[0] - before[0]) / (after[1] - before[1]) if after[1] > before[1] else 0.0


class Run:
    """Guests started together: each warms up, says ready, and runs `seconds` (or its own
    --seconds) from the go file; `during(t0)` runs in this process while they do.  Each guest's
    result carries `steal_cpus`: the host's CPUs its hypervisor held on average from the go until
    the last guest ended (its exit too; where the GPU host is itself a virtual machine, a window
    with steal is slower on the host's CPU whatever runs in it)."""

    def __init__(self, tmp: Path, seconds: float):
        self.tmp, self.seconds, self.n = tmp, seconds, 0

    def together(self, guests: list[tuple[list[str], dict]], during=None) -> list[dict]:
        self.n += 1
        go = self.tmp / f"go-{self.n}"
        procs = []
        try:
            for args, env in guests:
                cmd = [sys.executable, str(HERE / args[0]), "--seconds", str(self.seconds), "--go", str(go), *args[1:]]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            for p in procs:
                line = p.stdout.readline()
                if line.strip() != "ready":
                    sys.exit(f"a guest did not start: {line}{p.stderr.read()[-2000:]}")
            return self._wait(procs, go, during)
        except BaseException:  # (a failure, SIGTERM, ^C, in `during` too: no guest left holding the GPU)
            for q in procs:
                q.kill()
            raise

    def _wait(self, procs: list, go: Path, during) -> list[dict]:
        go.touch()
        began = host_steal()
        if during:
            during(time.monotonic())
        # (a lead first, a second window after a cap is lifted, or each guest's turn alone after
        # a shared window: caps, shared rows)
        limit = 2 * self.seconds + max(SHARED_LEAD[0], CAP_LEAD[0]) + 2 * OWN_ALONE[0] + 120
        results: list = [None] * len(procs)
        ended: queue.Queue = queue.Queue()

        def reap(i: int, p: subprocess.Popen) -> None:
            try:
                results[i] = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                pass
            ended.put(i)

        for i, p in enumerate(procs):
            threading.Thread(target=reap, args=(i, p), daemon=True).start()
        for _ in procs:  # (the first guest to fail is the one reported, whichever it is)
            i = ended.get()
            p = procs[i]
            if results[i] is None or p.returncode != 0:  # (the others killed on the way out: together)
                if results[i] is None:
                    sys.exit(f"a guest did not finish: {' '.join(map(str, p.args))}")
                sys.exit(f"a guest failed: {results[i][1][-2000:]}")
        out = [
            {k: _value(k, v) for k, v in (w.split("=", 1) for w in stdout.split() if "=" in w)} for stdout, _ in results
        ]
        stolen = steal_cpus(began, host_steal())
        for result in out:
            result["steal_cpus"] = stolen
        return out


def _value(key: str, text: str):
    """A guest's output value: a number, or for `each` (torch_train --each) a list of them."""
    return [float(v) for v in text.split(",") if v] if key == "each" else float(text)


def native_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VMGPU_REGION")}
    env.update(extra or {})
    return env


class Guests:
    """Forwarders, one per guest, made as asked and stopped at the end; their scheduler pages in
    a directory of this run's own."""

    def __init__(self, tmp: Path, depth: int | None, page_words: dict[str, int] | None = None):
        self.tmp, self.fwds, self.n, self.depth = tmp, [], 0, depth
        self.page_words = page_words or {}  # the page's control words this run sets (slice_us, ...)
        self.sched = tmp / "sched"
        self.names: list[str] = []

    def env(self, *flags: str, depth: int | None = None) -> dict:
        """A forwarder started with flags (and the run's depth, or this one): its guest's environment."""
        self.n += 1
        region = Path(f"/dev/shm/vmgpu-bench-share-{os.getpid()}-{self.n}")
        name = f"share-{self.n}"
        extra = ("--sched-dir", str(self.sched), *flags)
        if (depth or self.depth) is not None:
            extra += ("--sched-depth", str(depth or self.depth))
        fwd = Forwarder(region, backend="cuda", size="1G", guest=name, extra=extra).start()
        self.fwds.append((fwd, region))
        if self.page_words and "--no-sched" not in flags:
            with self.page() as pg:
                for word, value in self.page_words.items():
                    setattr(pg.page, word, value)  # one aligned 4-byte store, as `vmgpu policy` makes
        self.names.append(name)
        return guest_env(region, native_env())

    def page(self) -> Page:
        return Page(next(self.sched.glob("vmgpu-sched-*")))

    def stop(self) -> None:
        keep = os.environ.get("VMGPU_BENCH_LOGS")  # a directory to keep the forwarders' logs in
        for fwd, region in self.fwds:
            fwd.stop()
            region.unlink(missing_ok=True)
            if keep:
                with open(Path(keep) / f"{fwd.guest}.log", "a") as f:
                    f.write(fwd.log())
        self.fwds, self.names = [], []

    def policy(self, name: str) -> None:
        with self.page() as pg:
            pg.policy = name


def shared_pair(
    g: Guests,
    run: Run,
    rows,
    summary,
    solo: float,
    mps_pipe: str | None = None,
    trace=None,
    light_below=False,
    lever: str = "time",
    threads: tuple[int, int] | None = None,
) -> None:
    """Two trainers at 30/70 under the shared policy (on MPS if mps_pipe), its controller running
    as vmgpud runs it: their row, with the holds it gave them on average (%), and their parts'
    largest error and total in the summary (shared_share_err_pp, shared_total; `_no_mps` without
    MPS; `_depth` held by the depth lever, `_sms` on SM partitions (the sms lever); `_light_below`
    where the weight-30 guest's MPS client priority is below normal and the other's normal, so that
    the SMs run the heavier guest's kernels first and the light one fills what they leave;
    `_threads{N}` where the light guest's MPS active-thread percentage is threads[0] and the
    other's threads[1]: partitions that the controller corrects); what the controller saw every
    0.5 s, and at each look in a probe, to `trace`.  With OWN_ALONE seconds, each guest then runs
    alone in its own process, the light one first, the other idle (the controller still at work):
    own_alone_rows."""
    flags = ("--mps", mps_pipe) if mps_pipe else ()
    light, heavy = (("--mps-priority", "below"), ("--mps-priority", "normal")) if light_below else ((), ())
    if threads:
        light, heavy = (*light, "--mps-threads", str(threads[0])), (*heavy, "--mps-threads", str(threads[1]))
    train = [*TRAIN, "--lead", str(SHARED_LEAD[0])]  # measured once the controller has had its lead
    envs = [g.env("--weight", "30", *flags, *light), g.env("--weight", "70", *flags, *heavy)]
    names = g.names[-2:]
    own = OWN_ALONE[0] if not threads else 0.0  # (alone, a process keeps its MPS thread limit: not a share)
    betweens = [run.tmp / f"own-{n}-{time.monotonic_ns()}" for n in names] if own else []
    tail = [[*train, "--then-seconds", str(own), "--between", str(b)] for b in betweens] or [train, train]
    holds = {n: [] for n in names}
    books: dict[str, float] = {}  # each guest's rate alone as the controller holds it, at its last look
    traced = tracer(trace, holds)

    def seen(members, ctl):
        traced(members, ctl)
        books.update({k[1]: c.alone for k, c in ctl.guests.items()})

    if trace is not None:
        below = " (light guest below normal)" if light_below else ""
        trace.write(f"== shared {' '.join(flags)}{below}, lever {lever}: {names}\n")
    sampler, marks, stop = Sampler(g, 0.05), {}, threading.Event()
    turns = threading.Thread(target=own_turns, args=(betweens, stop, marks, books), daemon=True)

    def during(t0):
        marks["go"] = t0
        if betweens:
            sampler.start(t0)
            turns.start()

    with controlled(g, lever, seen):
        try:
            out = run.together(list(zip(tail, envs, strict=True)), during)
            if turns.is_alive():  # (the last guest's .done is there: its turn's end is marked)
                turns.join(1.0)
        finally:
            stop.set()
            samples = sampler.done()
    text = "; held " + " / ".join(f"{sum(h) / max(len(h), 1) / 10:.1f}%" for h in holds.values())
    rates = [o["img_per_s"] for o in out]
    key = (
        ("" if mps_pipe else "_no_mps")
        + lever_key(lever)
        + ("_light_below" if light_below else "")
        + (f"_threads{threads[0]}" if threads else "")
    )
    what = ("shared 30/70 on MPS" if mps_pipe else "shared 30/70 without MPS") + f" (after {SHARED_LEAD[0]:g} s)"
    what += ", the light guest's MPS client priority below normal" if light_below else ""
    what += {
        "depth": ", held by depth",
        "sms": ", on SM partitions",
        "smsfree": ", on SM partitions, the heavy guest on all SMs",
        "smsover": ", on SM partitions reaching into each other's",
    }.get(lever, "")
    what += f", MPS threads {threads[0]}/{threads[1]}" if threads else ""
    summary[f"shared_share_err_pp{key}"] = pair_row(rows, what, rates, solo, text)
    summary[f"shared_total{key}"] = sum(rates) / solo
    summary[f"shared_light{key}"] = light_part(rates)
    if betweens:
        window = marks["go"] + SHARED_LEAD[0]
        beside = held(samples, window + 0.5, window + run.seconds - 0.5)
        alone = {}
        for n, b in zip(names, betweens, strict=True):
            t0, t1 = marks.get(b, (math.nan, math.nan))
            alone[n] = held(samples, t0 + 0.5, t1 - 0.1).get(n, (0, 0, math.nan))[2]
        calls = {n: (beside.get(n, (0, 0, math.nan))[2], alone[n]) for n in names}
        own_alone_rows(rows, summary, what, key, rates, [o["img_per_s_then"] for o in out], calls, marks.get("books"))


def own_turns(betweens: list[Path], stop: threading.Event, marks: dict, books: dict) -> None:
    """Once every guest has made its between file's .ready (its shared window over), each in turn
    runs alone: its between file made, and the next guest's only once the guest before has made
    its .done and OWN_SETTLE_S seconds have passed.  marks: the controller's books (a copy of `books`)
    at the barrier, and each turn's (start, end) under its between file; until stop is set."""
    while not all(Path(f"{b}.ready").exists() for b in betweens):
        if stop.wait(0.002):
            return
    marks["books"] = dict(books)
    for i, b in enumerate(betweens):
        if i and stop.wait(OWN_SETTLE_S):
            return
        began = time.monotonic()
        b.touch()
        while not Path(f"{b}.done").exists():
            if stop.wait(0.002):
                return
        marks[b] = (began, time.monotonic())


def ratio(a: float, b: float) -> float:
    """a / b, or nan where b is 0 or either is not a number (a rate not measured)."""
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def own_alone_rows(
    rows, summary, what: str, key: str, rates: list[float], own: list[float], calls: dict, books: dict | None
) -> None:
    """A shared pair's rows by each guest's own rate alone (its window alone after the shared one,
    in the same process): the two guests' rates alone (img/s, work calls/s, and the controller's
    rates alone in calls/s as it held them at the barrier: 0 where it had none), and their parts
    with each guest's beside over its own alone, by images and by calls (what the controller
    steers by).  Summary: own_light, own_share_err_pp, own_calls_light, own_alone_ratio (light
    over heavy alone, img/s), own_calls_ratio, books_alone_ratio; nan where a rate is missing."""
    names = list(calls)
    # (a rate alone of 0 is one not measured: the controller's before its first probe, a turn
    # with no calls on the page)
    beside, alone = [calls[n][0] for n in names], [calls[n][1] or math.nan for n in names]
    kept = [(books or {}).get(n, math.nan) or math.nan for n in names]
    own = [o or math.nan for o in own]

    def parts_of(progress: list[float]) -> tuple[float, float]:  # (the light part, its error: pp)
        if not all(map(math.isfinite, progress)) or not sum(progress):
            return math.nan, math.nan
        light = light_part(progress)
        return light, abs(light - 30.0)

    light, err = parts_of([ratio(r, o) for r, o in zip(rates, own, strict=True)])
    calls_light, _ = parts_of([ratio(b, a) for b, a in zip(beside, alone, strict=True)])
    rows.append(
        (
            f"{what}: each alone after the window, in its own process (the other idle)",
            f"img/s {own[0]:.0f} / {own[1]:.0f} (light over heavy {ratio(own[0], own[1]):.3f}); calls/s "
            f"{alone[0]:.0f} / {alone[1]:.0f} ({ratio(alone[0], alone[1]):.3f}); the controller's rates alone at "
            f"the barrier {kept[0]:.0f} / {kept[1]:.0f} ({ratio(kept[0], kept[1]):.3f})",
        )
    )
    rows.append(
        (
            f"{what}: parts by each guest's own rate alone",
            f"{light:.1f} / {100 - light:.1f} (off {err:.1f} pp); by calls {calls_light:.1f} / {100 - calls_light:.1f}",
        )
    )
    summary[f"own_light{key}"] = light
    summary[f"own_share_err_pp{key}"] = err
    summary[f"own_calls_light{key}"] = calls_light
    summary[f"own_alone_ratio{key}"] = ratio(own[0], own[1])
    summary[f"own_calls_ratio{key}"] = ratio(alone[0], alone[1])
    summary[f"books_alone_ratio{key}"] = ratio(kept[0], kept[1])


def tracer(trace, holds: dict | None = None):
    """An after(members, controller) for `controlled`: each member's hold appended to holds[guest]
    at every look (where given), and what the controller saw every 0.5 s, and at each look in a
    probe, written to `trace` (where given): with each guest's kept probe reads, so that a rate
    alone can be traced to the probes it came from."""
    looks = [0]

    def seen(members, ctl):
        for m in members:
            (holds or {}).get(m.guest, []).append(m.hold)
        looks[0] += 1
        if trace is not None and (looks[0] % 5 == 0 or ctl.probe):
            state = {k[1]: (round(c.alone), round(c.open, 2), round(c.curve, 2)) for k, c in ctl.guests.items()}
            # (each guest's rate alone as its kept probes read it, and a short read awaiting its check)
            reads = {
                k[1]: [round(r) for r in c.probes] + ([f"short {round(c.short)}"] if c.short else [])
                for k, c in ctl.guests.items()
            }
            trace.write(
                f"{time.monotonic():.1f} holds {[m.hold for m in members]} depths {[m.depth for m in members]} "
                f"spans {[(m.sm_part >> 16, m.sm_part & 0xFFFF) for m in members]} calls "
                f"{[m.work_calls for m in members]} alone,open,curve {state} parts "
                f"{ {k: round(v, 3) for k, v in ctl.last.items()} } probe {ctl.probe and ctl.probe.whose} "
                f"reads {reads}\n"
            )

    return seen


def lever_note() -> str:
    """The sharedconverge and sharedreclaim rows' note of their lever (the last of --lever)."""
    return "" if LEVERS[-1] == "time" else f" ({LEVERS[-1]} lever)"


def slow_alone_rows(g: Guests, run: Run, rows, summary, solo: float, pipe: str | None, trace, lever: str) -> None:
    """Three trainers under shared (on MPS if pipe), at weights 30/70/10, after the controller's
    lead: the third honest, then (new guests) going slow whenever it runs alone, at SLOW_ALONE of
    its speed (torch_train.py --slow-alone: a probe then reads it short).  Their rows, and in the
    summary the third's part slow less its part honest (slow_alone_gain_pp, pp) and the least of
    the others' rates slow over honest (slow_alone_others)."""
    extra, name = ["--slow-alone", str(SLOW_ALONE[0])], f"slow alone ({SLOW_ALONE[0]:g})"
    hostile_rows(g, run, rows, summary, solo, pipe, trace, lever, extra, name, "slow_alone")


def off_span_rows(g: Guests, run: Run, rows, summary, solo: float, pipe: str | None, trace, lever: str) -> None:
    """As slow_alone_rows, the third with a stream capture open on a stream of its own
    (torch_train.py --open-capture), which keeps its work off its span and has every guest held
    by time: off_span_gain_pp, off_span_others, and the three's total over honest
    (off_span_total: what the others' spans were worth)."""
    hostile_rows(g, run, rows, summary, solo, pipe, trace, lever, ["--open-capture"], "off its span", "off_span")


def hostile_rows(
    g: Guests, run: Run, rows, summary, solo: float, pipe, trace, lever: str, extra: list, name: str, key: str
) -> None:
    """Three trainers under shared at 30/70/10 after the controller's lead, the 10 honest and then
    (new guests) with the hostile flags `extra`: their rows, `{key}_gain_pp`, `{key}_others` and
    `{key}_total` (each with the lever's suffix)."""
    train = [*TRAIN, "--lead", str(SHARED_LEAD[0])]
    flags = ("--mps", pipe) if pipe else ()
    got = {}
    for mode, more in (("honest", []), (name, extra)):
        envs = [g.env("--weight", w, *flags) for w in ("30", "70", "10")]
        if trace is not None:
            trace.write(f"== 30/70/10, the 10 {mode}, lever {lever}: {g.names[-3:]}\n")
        with controlled(g, lever, tracer(trace)):
            out = run.together([(train, envs[0]), (train, envs[1]), ([*train, *more], envs[2])])
        got[mode] = [o["img_per_s"] / solo for o in out]
    text, gain, others = slow_alone_summary(got["honest"], got[name])
    what = f"shared 30/70/10{' on MPS' if pipe else ''}, lever {lever}"
    rows.append((f"{what}, the 10 honest", text[0]))
    rows.append((f"{what}, the 10 {name}", text[1]))
    by = lever_key(lever)
    summary[f"{key}_gain_pp{by}"], summary[f"{key}_others{by}"] = gain, others
    total = sum(got["honest"])
    summary[f"{key}_total{by}"] = sum(got[name]) / total if total > 0 else math.nan


def slow_alone_summary(honest: list[float], slow: list[float]) -> tuple[list[str], float, float]:
    """The slowalone rows' text from each guest's rate over its rate alone (30, 70, 10), honest and
    slow; the 10's part of the three slow less honest (pp); the least of the others' slow over honest."""

    def part(rates):
        return 100 * rates[2] / sum(rates) if sum(rates) > 0 else math.nan

    ratio = [s / h if h > 0 else math.nan for s, h in zip(slow[:2], honest[:2], strict=True)]
    text = [
        " / ".join(f"{r:.3f}" for r in honest) + f" of alone; the 10's part {part(honest):.1f}%",
        " / ".join(f"{r:.3f}" for r in slow)
        + f" of alone; the 10's part {part(slow):.1f}%; the 30 and 70 at {ratio[0]:.3f} and {ratio[1]:.3f} of honest",
    ]
    return text, part(slow) - part(honest), min(ratio)


def alone_again(g: Guests, run: Run, rows, summary, solo: float, native_solo: float) -> None:
    """The trainer alone again at the run's end, through vmgpu and natively, against the rates
    alone at its start that every share and aggregate above is over (`alone_end_ratio`,
    `native_alone_end_ratio`): in session 57's H100 lease those moved by 5-10% from one run to the
    next, as much as the aggregate's gap to MPS, and a ratio that claims less than the drift
    between its denominators says nothing."""
    (end,) = run.together([(TRAIN, g.env())])
    g.stop()
    (native_end,) = run.together([(TRAIN, native_env())])
    ratios = [
        x / y if y > 0 else math.nan for x, y in ((end["img_per_s"], solo), (native_end["img_per_s"], native_solo))
    ]
    summary["alone_end_ratio"], summary["native_alone_end_ratio"] = ratios
    rows.append(
        (
            "trainer alone at the end (vmgpu / native)",
            f"{end['img_per_s']:.1f} / {native_end['img_per_s']:.1f} img/s: {ratios[0]:.3f} / {ratios[1]:.3f}"
            " of the start's",
        )
    )


def lever_key(lever: str) -> str:
    """The summary keys' suffix for a lever's shared rows (the time lever's: none)."""
    return "" if lever == "time" else f"_{lever}"


@contextlib.contextmanager
def controlled(g: Guests, lever: str = "time", after=None):
    """The shared policy on g's page, its controller running as vmgpud runs it from now on (the
    guests are measured alone while they warm up too, as in a host's life), after(members,
    controller) after each look; on leaving, the policy back to weighted with the holds lifted,
    and the forwarders stopped.  Yields the controller."""
    g.policy("shared")
    ctl = share_control.ShareController(**PROBE, lever=lever, depth=g.depth or share_control.DEPTH, overlap=OVERLAP[0])

    def control(stop):
        with g.page() as pg:
            share_control.run(pg, stop, controller=ctl, after=after)

    try:
        with on_a_thread(control):
            yield ctl
    finally:
        g.policy("weighted")
        with g.page() as pg:
            share_control.apply_step(pg, ctl, time.monotonic())  # (lifts the holds off shared)
        g.stop()


@contextlib.contextmanager
def on_a_thread(run):
    """run(stop) on a thread of its own while the block runs; then stop set and the thread joined."""
    stop = threading.Event()
    t = threading.Thread(target=run, args=(stop,), daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def shared_converge(g: Guests, run: Run, rows, summary, seconds: float, pipe: str | None, trace=None) -> None:
    """Two trainers at 50/50 under shared (on MPS if pipe), turned to 20/80 live halfway through
    their measured seconds, after --shared-lead seconds of the controller at work: how long
    until their parts of the progress are within 2 pp of 20/80 (converge_s_shared).  Progress is
    work calls per second over each guest's rate alone as the controller measured it, what the
    controller itself weighs (img/s cannot be had per half second); see converge_parts.  What the
    controller saw, to `trace` (--trace)."""
    flags = ("--mps", pipe) if pipe else ()
    lead = SHARED_LEAD[0]  # (guests that have run a while, as a weight is changed in practice: their rates alone known)
    train = [*TRAIN, "--lead", str(lead)]
    envs = [(train, g.env("--weight", "50", *flags)), (train, g.env("--weight", "50", *flags))]
    first, second = g.names[-2:]
    s = Sampler(g, 0.01)
    change = [None, lambda pg: (pg.set_weight(first, 20), pg.set_weight(second, 80))]
    marks = {}

    def during(t0):
        change[0] = marks["at"] = t0 + lead + seconds / 2
        marks["end"] = t0 + lead + seconds - 0.2
        s.start(t0, change)

    if trace is not None:
        trace.write(f"== sharedconverge, lever {LEVERS[-1]}: {[first, second]}, 50/50 -> 20/80 halfway\n")
    traced, seen = tracer(trace), []

    def look(members, ctl):  # (each guest's rate alone as the controller knew it, at each look)
        traced(members, ctl)
        seen.append((time.monotonic(), {k[1]: c.alone for k, c in ctl.guests.items()}))

    with controlled(g, LEVERS[-1], look):  # (the last of --lever)
        run.together(envs, during)
        samples = s.done()  # (before the forwarders stop and leave the page)
    alone = alone_at(seen, marks.get("end", 0))
    if not alone.get(first) or not alone.get(second):
        summary["converge_s_shared"] = float("nan")
        rows.append((f"shared{lever_note()}: weights 50/50 -> 20/80 live: converged", "no rate alone measured"))
        return
    summary["converge_s_shared"] = converge_parts(samples, marks["at"], marks["end"], first, second, alone, 20)
    rows.append(
        (f"shared{lever_note()}: weights 50/50 -> 20/80 live: converged", f"{summary['converge_s_shared']:.2f} s")
    )


def alone_at(seen: list, end: float) -> dict:
    """Of the controller's rates alone per guest at each look ((time, {guest: rate})), the last
    known by `end` with every guest's measured: not one from after, where one guest has stopped
    and the other's is measured again as its run winds down."""
    return next((a for t, a in reversed(seen) if t <= end and a and all(a.values())), {})


def converge_parts(samples: list, at: float, end: float, a: str, b: str, alone: dict, target: float) -> float:
    """From `at`, the end of the first half-second window (windows 0.1 s apart) in which a's part of
    the progress ((calls/s) / alone, a's over a's and b's) is within 2 pp of target and so is the
    next half second's, less `at`; inf if none."""

    times = [s[0] for s in samples]

    def calls_at(t):  # (the first sample at or after t)
        i = bisect.bisect_left(times, t)
        return samples[i][2] if i < len(samples) else None

    def part(t0, t1):
        c0, c1 = calls_at(t0), calls_at(t1)
        if c0 is None or c1 is None:
            return None
        pa, pb = (c1.get(a, 0) - c0.get(a, 0)) / alone[a], (c1.get(b, 0) - c0.get(b, 0)) / alone[b]
        return 100 * pa / (pa + pb) if pa + pb > 0 else None

    t = at
    while t + 1.0 <= end:
        p1, p2 = part(t, t + 0.5), part(t + 0.5, t + 1.0)
        if p1 is not None and p2 is not None and abs(p1 - target) <= 2 and abs(p2 - target) <= 2:
            return t + 0.5 - at
        t += 0.1
    return float("inf")


def shared_reclaim(g: Guests, run: Run, rows, summary, seconds: float, pipe: str | None, trace=None) -> None:
    """A trainer at 30 beside one at 70 under shared (on MPS if pipe), the heavier one stopping
    halfway: how long from its last work call until the light one goes at its rate alone
    (reclaim_ms_shared; see reclaim_rate_ms), and the work it lost meanwhile, as time at that rate
    (reclaim_lost_ms_shared; see reclaim_lost_ms).  To `trace` (--trace): from 100 ms before the
    leaver's last work call to 500 ms after, every 10 ms, each guest's calls since, span and hold."""
    flags = ("--mps", pipe) if pipe else ()
    envs = [
        (TRAIN, g.env("--weight", "30", *flags)),
        (TRAIN + ["--seconds", str(seconds / 2)], g.env("--weight", "70", *flags)),
    ]
    stayer, leaver = g.names[-2:]
    s = Sampler(g, 0.001)
    with controlled(g, LEVERS[-1]):  # (the last of --lever)
        run.together(envs, lambda t0: s.start(t0))
        samples = s.done()  # (before the forwarders stop and leave the page)
    summary["reclaim_ms_shared"] = reclaim_rate_ms(samples, stayer, leaver)
    summary["reclaim_lost_ms_shared"] = reclaim_lost_ms(samples, stayer, leaver)
    if trace is not None:
        trace_leave(trace, samples, stayer, leaver)
    rows.append(
        (
            f"shared{lever_note()}: a guest stops: the other at its rate alone after",
            f"{summary['reclaim_ms_shared']:.1f} ms (five 10 ms bins in a row at 80% of it); "
            f"its work lost in the next 0.5 s: {summary['reclaim_lost_ms_shared']:.0f} ms",
        )
    )


def last_call(samples: list, who: str) -> int | None:
    """The index of the last sample at which who's work_calls were seen to move, or None."""
    return max(
        (i for i in range(1, len(samples)) if samples[i][2].get(who, 0) > samples[i - 1][2].get(who, 0)),
        default=None,
    )


def trace_leave(trace, samples: list, stayer: str, leaver: str) -> None:
    """The samples around the leaver's last work call, as shared_reclaim says."""
    i_leave = last_call(samples, leaver)
    if i_leave is None:
        return
    last = samples[i_leave][0]
    trace.write(f"== sharedreclaim: {stayer} stays, {leaver} leaves; ms from its last work call\n")
    prev = None
    for t, _, calls, *rest in samples:
        where = rest[1] if len(rest) > 1 else {}
        if last - 0.1 <= t <= last + 0.5 and (prev is None or t - prev[0] >= 0.01):
            if prev is not None:
                trace.write(
                    f"{1000 * (t - last):7.1f} calls "
                    f"{[calls.get(n, 0) - prev[1].get(n, 0) for n in (stayer, leaver)]} span,hold "
                    f"{[where.get(n) for n in (stayer, leaver)]}\n"
                )
            prev = (t, calls)


def _alone_rate(samples: list, stayer: str, i_leave: int, i_stay: int) -> float | None:
    """The stayer's calls per second over the second half of its time alone (up to its own last
    call), or None."""
    i_tail = (i_leave + i_stay) // 2
    span = samples[i_stay][0] - samples[i_tail][0]
    return (samples[i_stay][2][stayer] - samples[i_tail][2].get(stayer, 0)) / span if span > 0 else None


def reclaim_lost_ms(samples: list, stayer: str, leaver: str, horizon_s: float = 0.5) -> float:
    """The idle guest's share not yet reclaimed, as time: over `horizon_s` from the leaver's last
    work call, that span less the stayer's calls in it over its rate alone (_alone_rate): a stayer
    at its rate alone from the first instant lost 0 ms, one held back entirely for d ms lost d.
    Unlike reclaim_rate_ms it does not ask each 10 ms of a bursty guest to be near its mean; its
    error is the rate alone's (5% of it over 0.5 s: 25 ms).  nan as reclaim_rate_ms."""
    i_leave, i_stay = last_call(samples, leaver), last_call(samples, stayer)
    if i_leave is None or i_stay is None or i_stay <= i_leave:
        return float("nan")
    last = samples[i_leave][0]
    rate = _alone_rate(samples, stayer, i_leave, i_stay)
    times = [x[0] for x in samples]
    i_end = bisect.bisect_left(times, last + horizon_s)
    if not rate or i_end > i_stay:
        return float("nan")
    done = samples[i_end][2].get(stayer, 0) - samples[i_leave][2].get(stayer, 0)
    return 1000 * ((samples[i_end][0] - last) - done / rate)


def reclaim_rate_ms(samples: list, stayer: str, leaver: str, bin_s: float = 0.01) -> float:
    """From the leaver's last work call (the sample its work_calls were last seen to move at) to
    the first 10 ms bin from which the stayer's calls in each of five bins in a row are at least 80%
    of its rate alone (its calls per bin over the second half of its time alone, up to its own
    last call); inf if never, nan if either made no call after the other."""

    i_leave, i_stay = last_call(samples, leaver), last_call(samples, stayer)
    if i_leave is None or i_stay is None or i_stay <= i_leave:
        return float("nan")
    last = samples[i_leave][0]
    rate = _alone_rate(samples, stayer, i_leave, i_stay)
    if not rate:
        return float("nan")
    per_bin = rate * bin_s

    times = [s[0] for s in samples]

    def calls_at(t):  # (the first sample at or after t)
        i = bisect.bisect_left(times, t)
        return samples[i][2].get(stayer, 0) if i < len(samples) else None

    t = last
    while t + 5 * bin_s <= samples[i_stay][0]:
        marks = [calls_at(t + i * bin_s) for i in range(6)]
        if None not in marks and all(b - a >= 0.8 * per_bin for a, b in zip(marks, marks[1:], strict=False)):
            return 1000 * (t - last)
        t += bin_s
    return float("inf")


def nosched_pair(g: Guests, run: Run) -> float:
    """The two trainers through vmgpu with --no-sched, side by side: their img/s together."""
    n1, n2 = run.together([(TRAIN, g.env("--no-sched")), (TRAIN, g.env("--no-sched"))])
    g.stop()
    return n1["img_per_s"] + n2["img_per_s"]


def native_mps_pair(run: Run, env: dict, split: tuple[int, int] = (30, 70)) -> list[dict]:
    """The two trainers natively under MPS (env: mps_start's) at `split` active-thread percentages
    (light / heavy; by default the weights, 30/70)."""
    return run.together([(TRAIN, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}) for pct in split])


SAME_SHARES_TOL_PP = 1.0  # a native MPS split whose light part is this close to the weights' is looked no further
SAME_SHARES_RUNS = 2  # at most this many more native MPS windows to find it
SHARES_TOL_PP = 2.0  # the tenant shares' tolerance (issue 20): a split further off is no reference at the same shares
BRACKET_RUNS = 2  # at most this many more native MPS windows so that each shared row's part has a split either side
BRACKET_REACH_PP = 5.0  # ... for a row this close to the weights' part (one further off missed 30/70: not chased)
BRACKET_PAST_PP = 1.5  # ... aimed this far past the row's part, so that noise leaves it on the far side
BRACKET_STEP = 2  # ... or, where the splits' parts give no rising line, this many threads (%) past the last


def light_part(rates) -> float:
    """The light (first) guest's part of a pair's rates, %."""
    return 100 * rates[0] / sum(rates)


def _logit(part_pct: float) -> float:
    p = min(max(part_pct, 0.5), 99.5) / 100
    return math.log(p / (1 - p))


def next_mps_light(points: list[tuple[int, float]], target: float) -> int | None:
    """The light guest's MPS active-thread percentage (the heavy one's being 100 minus it) to try
    next so that the light guest's part of the pair comes out at `target` %, from the
    (percentage, light part %) pairs measured so far.  On the model that each guest's speed goes
    as a power of its thread limit, logit(part) is linear in log(t / (100 - t)): through the
    origin from one point (equal limits, equal parts), through the two points nearest the target
    from more.  None where the model gives a percentage already measured, or none (a line that
    does not rise)."""
    if not points:
        return None
    xs = {t: math.log(t / (100 - t)) for t, _ in points if 0 < t < 100}
    near = sorted((p for p in points if p[0] in xs), key=lambda p: abs(p[1] - target))
    (t1, p1), rest = near[0], [p for p in near[1:] if p[0] != near[0][0]]
    x0, y0 = (xs[rest[0][0]], _logit(rest[0][1])) if rest else (0.0, 0.0)
    if xs[t1] == x0 or (_logit(p1) - y0) / (xs[t1] - x0) <= 0:
        return None
    slope = (_logit(p1) - y0) / (xs[t1] - x0)
    x = xs[t1] + (_logit(target) - _logit(p1)) / slope
    t = min(99, max(1, round(100 / (1 + math.exp(-x)))))
    return None if t in {q for q, _ in points} else t


def mps_same_shares(run: Run, env: dict, rows, native_solo: float, measured: dict, target: float = 30.0):
    """Native MPS at the same tenant shares as the weights: from the splits measured so far
    (`measured`: (light, heavy) -> the pair's img/s), up to SAME_SHARES_RUNS more native windows
    at the thread limits next_mps_light gives, until a split's light part is within
    SAME_SHARES_TOL_PP of `target`; each a row.  MPS's thread limits are not its tenant shares (at
    30/70 two trainers' parts come out near 35/65), so "MPS at the same shares" is the split that
    delivers them.  The (split, light part, the pair's total of one alone natively) nearest the
    target, or None where none measured sums to 100; the splits it measured are added to
    `measured`."""

    points = {s: r for s, r in measured.items() if s[0] + s[1] == 100}
    for _ in range(SAME_SHARES_RUNS):
        if not points or min(abs(light_part(r) - target) for r in points.values()) <= SAME_SHARES_TOL_PP:
            break
        t = next_mps_light([(s[0], light_part(r)) for s, r in points.items()], target)
        if t is None:
            break
        split = (t, 100 - t)
        points[split] = measured[split] = [x["img_per_s"] for x in native_mps_pair(run, env, split)]
        pair_row(rows, f"MPS {t}/{100 - t} (native; towards the weights' shares)", points[split], native_solo)
    if not points:
        return None
    split = min(points, key=lambda s: abs(light_part(points[s]) - target))
    return split, light_part(points[split]), sum(points[split]) / native_solo


def mps_bracket(run: Run, env: dict, rows, native_solo: float, measured: dict, lights: list[float]) -> None:
    """Up to BRACKET_RUNS more native MPS windows, each a row and added to `measured`, so that
    every light part in `lights` within BRACKET_REACH_PP of 30 has a split measured whose light
    part is at or below it and one at or above it (mps_total_at gives none otherwise): a row
    that came out a point under the lowest split's part is compared at its own part, not left
    nan.  Each split is next_mps_light's for BRACKET_PAST_PP past the part on the side missing, or
    BRACKET_STEP threads past the last split that way where the parts measured give no rising line;
    the row furthest out first.  (A split so measured that comes out nearer the weights' part than
    mps_same_shares' is not taken for it: that one was chosen before.)"""

    runs, sides = 0, {True, False}  # (below the splits' parts, above them: a side given up is left)
    while runs < BRACKET_RUNS:
        parts = [(s[0], light_part(r)) for s, r in measured.items() if s[0] + s[1] == 100]
        if not parts:
            return
        seen = [p for _, p in parts]
        missing = [
            x
            for x in lights
            if abs(x - 30.0) <= BRACKET_REACH_PP and not (min(seen) <= x <= max(seen)) and (x < min(seen)) in sides
        ]
        if not missing:
            return
        # the row furthest out on a side, so that one split serves every row on it
        lo = [x for x in missing if x < min(seen)]
        below = bool(lo)
        x = min(lo) if below else max(missing)
        t = next_mps_light(parts, x - BRACKET_PAST_PP if below else x + BRACKET_PAST_PP)
        done = {s for s, _ in parts}
        if t is None or t in done or (t > min(done) if below else t < max(done)):
            # (the model's line does not rise where MPS's parts came out out of order, as 23/77
            # and 24/76 did on an H100, 28.6 and 28.4: a step past the last split that way)
            t = min(done) - BRACKET_STEP if below else max(done) + BRACKET_STEP
            if not 1 <= t <= 99:
                sides.discard(below)
                continue
        runs += 1
        split = (t, 100 - t)
        measured[split] = [r["img_per_s"] for r in native_mps_pair(run, env, split)]
        pair_row(
            rows,
            f"MPS {t}/{100 - t} (native; so that each shared row's part has a split either side)",
            measured[split],
            native_solo,
        )


def mps_total_at(points: list[tuple[float, float]], light: float) -> float | None:
    """Native MPS's total at the light guest's part `light` (%), from the (light part, total)
    pairs of the splits measured: on the line between the nearest below it and the nearest above
    it (where two trainers' parts go, so goes their total: the light one's part is cheap to give,
    at 24/76 to 30/70 an H100 pair gained about 0.9% of one alone per point of the light part);
    None outside the parts measured (no guess past them)."""
    at: dict[float, list[float]] = {}
    for x, y in points:  # (splits whose parts came out the same: their mean)
        at.setdefault(x, []).append(y)
    below = [x for x in at if x <= light]
    above = [x for x in at if x >= light]
    if not below or not above:
        return None
    x0, x1 = max(below), min(above)
    y0, y1 = sum(at[x0]) / len(at[x0]), sum(at[x1]) / len(at[x1])
    return y0 if x1 == x0 else y0 + (y1 - y0) * (light - x0) / (x1 - x0)


def same_shares_row(rows, summary, found) -> float | None:
    """The row and summary keys of mps_same_shares' answer; the pair's total where its light part
    is within SHARES_TOL_PP of the weights', else None (no reference at the same shares)."""
    if found is None:
        return None
    (lo, hi), light, total = found
    ok = abs(light - 30.0) <= SHARES_TOL_PP
    rows.append(
        (
            "MPS at the weights' shares (native)",
            f"{lo}/{hi}: parts {light:.1f} / {100 - light:.1f}, together {total:.2f}"
            + ("" if ok else f" (none within {SHARES_TOL_PP:g} pp of 30/70: no reference at the same shares)"),
        )
    )
    summary["mps_same_shares_light"] = float(lo)
    return total if ok else None


def shared_references(g: Guests, run: Run, rows, summary, solo: float, native_solo: float, tmp: Path, mps: bool) -> str:
    """Where the weighted rows are skipped, the shared rows' references in the same run: the two
    trainers through vmgpu with --no-sched, and natively under MPS at each --mps-refs split of
    active-thread percentages (30/70 by default: what users would pick instead); the shared
    totals over each in the summary (aggregate_shared_vs_nosched, aggregate_shared_vs_mps at
    30/70, aggregate_shared_vs_mps_atLIGHT at another split, and _light_below).  The text for the
    aggregate row."""
    nosched = nosched_pair(g, run) / solo
    text = f", no-sched {nosched:.2f}"
    env = mps_start(tmp) if mps else None
    mps_totals = {}  # (light, heavy) -> the pair's total, of one alone natively
    same = None  # the pair's total natively on MPS at the weights' tenant shares
    if env:
        try:
            measured = {}
            for split in MPS_REFS:
                light, heavy = native_mps_pair(run, env, split)
                measured[split] = [light["img_per_s"], heavy["img_per_s"]]
                pair_row(rows, f"MPS {split[0]}/{split[1]} (native)", measured[split], native_solo)
                mps_totals[split] = sum(measured[split]) / native_solo
                text += f", MPS {split[0]}/{split[1]} (native) {mps_totals[split]:.2f}"
            if "mpssame" not in SKIP:
                found = mps_same_shares(run, env, rows, native_solo, measured)
                same = same_shares_row(rows, summary, found)
                if same is not None:
                    text += f", MPS at the weights' shares ({found[0][0]}/{found[0][1]}, native) {same:.2f}"
                # and at each shared row's own parts, which come near 30/70 but not to it (mps_bracket)
                lights = [v for k, v in summary.items() if k.startswith("shared_light")]
                mps_bracket(run, env, rows, native_solo, measured, lights)
                parts_seen = [(light_part(r), sum(r) / native_solo) for sp, r in measured.items() if sum(sp) == 100]
                for key in [k.removeprefix("shared_light") for k in list(summary) if k.startswith("shared_light")]:
                    at = mps_total_at(parts_seen, summary[f"shared_light{key}"])
                    summary[f"aggregate_shared_vs_mps_equal_parts{key}"] = (
                        summary[f"shared_total{key}"] / at if at is not None else float("nan")
                    )
                    rows.append(
                        (
                            f"MPS at the parts of the shared row ({key.lstrip('_') or 'time'}; native, "
                            "between the splits measured)",
                            f"light part {summary[f'shared_light{key}']:.1f}: "
                            + (f"together {at:.3f}" if at is not None else "outside the parts measured: none"),
                        )
                    )
        finally:
            mps_stop(env)
    for key in [k.removeprefix("shared_total") for k in list(summary) if k.startswith("shared_total")]:
        if f"shared_total{key}" in summary:
            summary[f"aggregate_shared_vs_nosched{key}"] = summary[f"shared_total{key}"] / nosched
            for (lo, hi), total in mps_totals.items():  # (at the weights: the name the summary always had)
                at = "" if (lo, hi) == (30, 70) else f"_at{lo}"
                summary[f"aggregate_shared_vs_mps{at}{key}"] = summary[f"shared_total{key}"] / total
            if env and "mpssame" not in SKIP:
                summary[f"aggregate_shared_vs_mps_same_shares{key}"] = (
                    summary[f"shared_total{key}"] / same if same else float("nan")
                )
    return text


def steal_row(rows, what: str, result: dict) -> None:
    """Where a window's result says (Run.together's), a row of the host's CPUs its hypervisor held
    meanwhile."""
    if "steal_cpus" in result:
        rows.append((f"{what}: the host's CPUs its hypervisor held (steal)", f"{result['steal_cpus']:.2f}"))


SLOW_BARS_MS = (15.0, 25.0)  # --alone-turns: requests over these, counted on both sides alike


def alone_turns(g: Guests, run: Run, rows, summary, infer, pairs: int, keep: Path | None) -> None:
    """--alone-turns N: the inference guest alone through vmgpu, then natively, N times by turns.
    Each window's p50 / p99, its requests over twice its own p50 (the slow stretches) and the
    host's CPUs its hypervisor held meanwhile; the p99 of every request through vmgpu over that of
    every native one (alone_p99_vmgpu_vs_native), and each side's mean steal.  Taken in turns, a
    stretch of steal on the host falls on both sides alike: a side that is slower with the same
    steal is slower of itself, and a side with more steal draws it.  The requests over each of
    SLOW_BARS_MS are counted on both sides (over_15ms_vmgpu, ...).  With `keep`, each window's
    requests (turns-vmgpu-N.txt, turns-native-N.txt) are kept there."""
    lats: dict[str, list[float]] = {"vmgpu": [], "native": []}  # every request's, each side's
    steal: dict[str, list[float]] = {"vmgpu": [], "native": []}
    for n in range(1, pairs + 1):
        for side, how in (("vmgpu", "through vmgpu"), ("native", "natively")):
            f = run.tmp / f"turns-{side}-{n}.txt"
            (r,) = run.together([(infer + ["--latencies", str(f)], g.env() if side == "vmgpu" else native_env())])
            if side == "vmgpu":
                g.stop()
            window = latencies(f)
            lats[side] += window
            steal[side].append(r.get("steal_cpus", 0.0))
            if keep:
                shutil.copy(f, keep / f.name)
            slow = sum(t > 2 * r["p50_ms"] for t in window)
            rows.append(
                (
                    f"inference alone {how}, turn {n}: p50 / p99, over 2x p50, steal",
                    f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms, {slow} requests, {steal[side][-1]:.2f} CPUs",
                )
            )
    vm, nat = p99_of(lats["vmgpu"]), p99_of(lats["native"])
    summary["alone_p99_vmgpu_vs_native"] = vm / nat
    summary["steal_cpus_vmgpu"] = statistics.mean(steal["vmgpu"])
    summary["steal_cpus_native"] = statistics.mean(steal["native"])
    rows.append(
        (
            f"inference alone by turns, {pairs} each: p99 through vmgpu / natively, steal",
            f"{vm:.2f} / {nat:.2f} ms, {vm / nat:.3f}x; {summary['steal_cpus_vmgpu']:.2f} / "
            f"{summary['steal_cpus_native']:.2f} CPUs",
        )
    )
    # the same bars for both sides (each window's own p50 differs between them): how many requests
    # each drew over them, of how many
    for bar in SLOW_BARS_MS:
        for side in lats:
            summary[f"over_{bar:g}ms_{side}"] = sum(t > bar for t in lats[side])
        rows.append(
            (
                f"inference alone by turns: requests over {bar:g} ms through vmgpu / natively",
                f"{summary[f'over_{bar:g}ms_vmgpu']} / {summary[f'over_{bar:g}ms_native']}"
                f" of {len(lats['vmgpu'])} / {len(lats['native'])}",
            )
        )


def priority_rows(rows, summary, hp: dict, tr: dict, infer_alone: dict, solo: float, what: str, key: str) -> None:
    """The priority scenario's rows and summary: the inference guest's p50 / p99 beside the
    trainer and its p99 over its p99 alone; the trainer's share against 80% of what the inference
    guest left (1 - its busy share alone)."""
    summary[f"hp_p99_ratio{key}"] = hp["p99_ms"] / infer_alone["p99_ms"]
    target = 0.8 * (1 - infer_alone["busy"])
    summary[f"hp_trainer_vs_target{key}"] = (tr["img_per_s"] / solo) / target
    rows.append(
        (f"{what}: inference p50 / p99{' beside' if not key else ''}", f"{hp['p50_ms']:.2f} / {hp['p99_ms']:.2f} ms")
    )
    rows.append((f"{what}: the trainer's share (target)", f"{100 * tr['img_per_s'] / solo:.1f}% ({100 * target:.1f}%)"))
    steal_row(rows, what, hp)


def shared_priority(g: Guests, run: Run, rows, summary, infer, infer_alone: dict, solo: float, pipe: str) -> None:
    """The priority scenario under shared on MPS: inference (high) beside a trainer (normal), side
    by side, the trainer's work waiting while the inference guest's goes; no holds (the busy guests
    of the highest priority share among themselves, and here that is one guest).  Twice: with the
    MPS client priorities the forwarders set (the trainer's kernels below normal), and without
    (--mps-priority driver), to show what they add; and with each --yield-depths (the trainer held
    to that depth for half a second after the inference guest's last work); each --prio-runs
    times, by turns."""
    ways = (
        (((), "priority on shared (MPS)", "_shared"),)
        + ((("--mps-priority", "driver"), "priority on shared (MPS), no client priority", "_shared_no_client_prio"),)
        * CLIENT_PRIO_OFF[0]
        + tuple(
            (("--yield-depth", str(y)), f"priority on shared (MPS), yield depth {y}", f"_shared_yield{y}")
            for y in YIELD_DEPTHS
        )
    )
    for i, (flags, what, key) in enumerate(ways * PRIO_RUNS[0]):
        if i >= len(ways):  # a run after the first: its own rows and keys
            n = i // len(ways) + 1
            what, key = f"{what}, run {n}", f"{key}_{n}"
        envs = [(infer, g.env("--priority", "high", "--mps", pipe, *flags)), (TRAIN, g.env("--mps", pipe, *flags))]
        g.policy("shared")
        try:
            hp, tr = run.together(envs)
        finally:
            g.policy("weighted")
            g.stop()
        priority_rows(rows, summary, hp, tr, infer_alone, solo, what, key)


def reserve_priority(
    g: Guests, run: Run, rows, summary, infer, infer_alone: dict, solo: float, pipe: str, keep: Path | None = None
) -> None:
    """The priority scenario under shared on MPS with the share controller on the sms lever: the
    trainer, while the inference guest (high) is busy, on a span of the SMs that leaves the
    inference guest its weight's part free, its work going on beside it (the priority reserve:
    vmgpu/share_control.py); for each --prio-reserve weight of the inference guest (the trainer's
    100 minus it), with the part of the controller's looks within the measured seconds at which the
    trainer had a span (span_looks).  With --prio-runs N, each weight's row N times, and the p99
    of all their requests pooled against the p99 of all the requests of N windows of the inference
    guest alone through vmgpu (a 1-in-100 tail of N times as many requests): the first is the
    bench's own (measured before the MPS daemon starts; the guest alone is no MPS client either
    way), the others run before the first weight's runs 2..N, and later weights are pooled against
    the same ones.  Each run's own row is over the first alone window's p99.  With `keep`, each
    window's requests (arrival on the host's monotonic clock, latency) and the controller's looks
    (time, whether the trainer had a span, the span, whose probe; the trainer's work calls and GPU
    time (ns), the inference guest's, and when the trainer last worked off its span (ms)) are
    written there as they come."""
    alone_files = [infer_alone["file"]]
    if keep:
        shutil.copy(alone_files[0], keep / alone_files[0].name)
    for w in PRIO_RESERVE:
        pooled, shares = [], []
        for n in range(1, PRIO_RUNS[0] + 1):
            if n > len(alone_files):  # (the next alone window, the first weight's turn)
                alone_window(run, rows, infer, g.env(), alone_files, keep, False, g.stop)
            f = run.tmp / f"reserve{w}-{n}.txt"
            envs = [
                (infer + ["--latencies", str(f)], g.env("--priority", "high", "--weight", str(w), "--mps", pipe)),
                (TRAIN, g.env("--weight", str(100 - w), "--mps", pipe)),
            ]
            trainer = g.names[-1]
            looks, marks = [], {}

            def after(members, ctl, trainer=trainer, looks=looks):
                t = next((m for m in members if m.guest == trainer), None)
                i = next((m for m in members if m.guest != trainer), None)
                span = ctl.spans.get(t.slot if t else None, (0, 0))
                whose = ctl.probe.whose[1] if ctl.probe is not None else "-"
                # (the guests' work calls and GPU time, and the trainer's last work off its span)
                seen = [x for m in (t, i) for x in ((m.work_calls, m.used_ns) if m else (0, 0))]
                looks.append((time.monotonic(), span != (0, 0), span, whose, (*seen, t.whole_ms if t else 0)))

            with controlled(g, "sms", after):
                hp, tr = run.together(envs, lambda t0, marks=marks: marks.update(t0=t0))
            key, what = f"_reserve{w}", f"priority on SM spans, reserve {w}%"
            if n > 1:
                key, what = f"{key}_{n}", f"{what}, run {n}"
            priority_rows(rows, summary, hp, tr, infer_alone, solo, what, key)
            had = span_looks([(t, h) for t, h, *_ in looks], marks["t0"], marks["t0"] + run.seconds)
            rows.append((f"{what}: looks the trainer had a span", f"{100 * had:.0f}%"))
            pooled.append(f)
            shares.append(tr["img_per_s"] / solo)
            if keep:
                shutil.copy(f, keep / f.name)
                with open(keep / f"looks-reserve{w}-{n}.txt", "w") as out:
                    out.writelines(
                        f"{t:.6f} {int(h)} {lo} {hi} {who} {' '.join(map(str, seen))}\n"
                        for t, h, (lo, hi), who, seen in looks
                    )
        target = 0.8 * (1 - infer_alone["busy"])
        pooled_rows(
            rows, summary, f"priority on SM spans, reserve {w}%", f"_reserve{w}", pooled, alone_files, shares, target
        )


def native_reserve_priority(
    run: Run, rows, summary, infer, infer_native: dict, native_solo: float, pipe: str, keep: Path | None = None
) -> None:
    """What MPS itself gives the priority reserve's case (--prio-native): the same inference guest
    and trainer natively, both clients of the same MPS daemon, the trainer on 100 - w of the active
    threads at the client priority below normal, the inference guest on all of them at normal; for
    each --prio-reserve weight, --prio-runs times, each run after the first after a window of the
    inference guest alone natively (no MPS client, as the bench's first), pooled as the reserve's
    rows; the trainer's share is of its speed alone natively."""
    alone_files = [infer_native["file"]]
    if keep:
        shutil.copy(alone_files[0], keep / alone_files[0].name)
    mps = native_env({"CUDA_MPS_PIPE_DIRECTORY": pipe})
    target = 0.8 * (1 - infer_native["busy"])
    for w in PRIO_RESERVE:
        files, shares = [], []
        base = f"natively on MPS, the trainer on {100 - w}% of the threads"
        for n in range(1, PRIO_RUNS[0] + 1):
            if n > len(alone_files):
                alone_window(run, rows, infer, native_env(), alone_files, keep, True)
            f = run.tmp / f"native{w}-{n}.txt"
            trainer = {**mps, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 - w), "CUDA_MPS_CLIENT_PRIORITY": "1"}
            hp, tr = run.together([(infer + ["--latencies", str(f)], mps), (TRAIN, trainer)])
            key, what = (f"_native{w}", base) if n == 1 else (f"_native{w}_{n}", f"{base}, run {n}")
            priority_rows(rows, summary, hp, tr, infer_native, native_solo, what, key)
            files.append(f)
            shares.append(tr["img_per_s"] / native_solo)
            if keep:
                shutil.copy(f, keep / f.name)
        pooled_rows(rows, summary, base, f"_native{w}", files, alone_files, shares, target)


def alone_window(run: Run, rows, infer, env: dict, files: list, keep: Path | None, native: bool, stop=None) -> None:
    """One more window of the inference guest alone (through vmgpu, or natively where `native`),
    its requests' file appended to `files` and, with `keep`, kept as it comes (a guest failing
    later ends the bench); its p50 / p99 as a row."""
    n = len(files) + 1
    f = run.tmp / f"{'native-' if native else ''}alone-{n}.txt"
    (alone,) = run.together([(infer + ["--latencies", str(f)], env)])
    if stop:
        stop()
    files.append(f)
    if keep:
        shutil.copy(f, keep / f.name)
    how = " natively" if native else ""
    rows.append((f"inference alone{how}, run {n}: p50 / p99", f"{alone['p50_ms']:.2f} / {alone['p99_ms']:.2f} ms"))
    steal_row(rows, f"inference alone{how}, run {n}", alone)


def pooled_rows(rows, summary, what: str, key: str, files: list, alone_files: list, shares: list, target: float):
    """Where a priority row ran more than once: the p99 of all its runs' requests over that of all
    the requests of as many alone windows, and the trainer's mean share against its target."""
    if len(files) < 2:
        return
    p99, p99_alone = pooled_p99(files), pooled_p99(alone_files[: len(files)])
    share = sum(shares) / len(shares)
    summary[f"hp_p99_ratio{key}_pooled"] = p99 / p99_alone
    summary[f"hp_trainer_vs_target{key}_pooled"] = share / target
    rows.append(
        (
            f"{what}, {len(files)} runs pooled: p99 (alone)",
            f"{p99:.2f} ({p99_alone:.2f}) ms, {p99 / p99_alone:.3f}x; the trainer's share "
            f"{100 * share:.1f}% ({100 * target:.1f}%)",
        )
    )


def latencies(f: Path) -> list[float]:
    """The latencies (ms) in a torch_infer --latencies file, one a request."""
    return [float(line.split()[1]) for line in Path(f).read_text().splitlines() if line.strip()]


def p99_of(latencies_ms: list[float]) -> float:
    """The p99 (ms) of these requests' latencies."""
    return statistics.quantiles(latencies_ms, n=100)[98]


def pooled_p99(files: list[Path]) -> float:
    """The p99 (ms) of every request in these torch_infer --latencies files together."""
    return p99_of([t for f in files for t in latencies(f)])


def span_looks(looks: list[tuple[float, bool]], t0: float, t1: float) -> float:
    """Of the controller's looks ((time, whether the trainer had a span)) within the measured
    seconds [t0, t1], the part at which it had one (not the guests' start before, when the
    inference guest may not be at work yet, nor their end); nan if none fell there."""
    inside = [had for t, had in looks if t0 <= t <= t1]
    return sum(inside) / len(inside) if inside else float("nan")


def depth_rows(g: Guests, run: Run, rows, solo: float, depths: list[int], pipe: str, seconds: float) -> None:
    """A trainer alone on MPS under the shared policy (never held: alone), held to each depth,
    and with --no-sched (no depth): its share of `solo` and its work calls per second on the
    page, what the share controller takes for its progress."""
    for depth in depths:
        env = g.env("--mps", pipe, depth=depth)
        name = g.names[-1]
        g.policy("shared")
        (out,), h = sampled_held(g, run, [(TRAIN, env)], seconds)
        g.policy("weighted")
        g.stop()
        rate = h[name][2] if h.get(name, (0, 0, 0))[2] else float("nan")
        rows.append(
            (f"alone on MPS under shared, depth {depth}", f"{100 * out['img_per_s'] / solo:.1f}%, {rate:,.0f} calls/s")
        )
    (out,) = run.together([(TRAIN, g.env("--mps", pipe, "--no-sched"))])
    g.stop()
    rows.append(("alone on MPS, --no-sched (no depth)", f"{100 * out['img_per_s'] / solo:.1f}%"))


def mps_start(tmp: Path) -> dict | None:
    """An MPS control daemon of our own; the environment its clients need, or None."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        return None
    env = native_env({"CUDA_MPS_PIPE_DIRECTORY": str(tmp / "mps-pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp / "mps-log")})
    for d in ("mps-pipe", "mps-log"):
        (tmp / d).mkdir(mode=0o700, exist_ok=True)  # (a forwarder refuses a pipe directory others reach)
    if subprocess.run([ctl, "-d"], env=env).returncode != 0:
        return None
    return env


def mps_stop(env: dict) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env)
    time.sleep(1)


def normalised_err(rates: list[float], solo: float, weights: list[int]) -> tuple[float, list[float]]:
    """The largest gap, in pp, between a guest's part of the shares and its part of the weights."""
    shares = [r / solo for r in rates]
    parts = [100 * s / sum(shares) for s in shares]
    return max(abs(p - 100 * w / sum(weights)) for p, w in zip(parts, weights, strict=True)), parts


def pair_row(rows, what: str, rates: list[float], solo: float, extra: str = "") -> float:
    """The row of two guests at 30/70: their shares of `solo` and, normalised, their parts of the
    whole (then `extra`); the parts' largest gap from the weights (pp)."""
    err, parts = normalised_err(rates, solo, [30, 70])
    rows.append(
        (
            f"{what}: shares (normalised)",
            f"{100 * rates[0] / solo:.1f}% / {100 * rates[1] / solo:.1f}% ({parts[0]:.1f} / {parts[1]:.1f})" + extra,
        )
    )
    return err


class Rows(list):
    """The table's rows, each also said on stderr as it is measured (a run cut short keeps them)."""

    def append(self, row: tuple[str, str]) -> None:
        print(f"  {row[0]}: {row[1]}", file=sys.stderr, flush=True)
        super().append(row)


class Sampler:
    """The scheduler page's GPU time per guest, every `every` seconds, on a thread."""

    def __init__(self, g: Guests, every: float):
        self.g, self.every, self.samples, self.stop = g, every, [], threading.Event()
        self.thread: threading.Thread | None = None  # (None until started: the guests may fail first)

    def start(self, _t0: float, at=None) -> None:
        def loop():
            with self.g.page() as pg:
                while not self.stop.is_set():
                    now, used = pg.gpu_time()
                    members = pg.members()
                    calls = {m.guest: pg.page.slot[m.slot].work_calls for m in members}
                    turns = {m.guest: m.turns for m in members}
                    where = {m.guest: (m.sm_part, m.hold) for m in members}
                    self.samples.append((now / 1e9, used, calls, turns, where))
                    if at and at[0] is not None and now / 1e9 >= at[0]:
                        at[1](pg)
                        at[0] = None
                    time.sleep(self.every)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def done(self) -> list:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        return self.samples


def _share(samples: list, t0: float, t1: float, guest: str) -> float | None:
    """guest's part of the GPU time on the page between t0 and t1, in %."""
    a = [s for s in samples if s[0] >= t0]
    b = [s for s in samples if s[0] >= t1]
    if not a or not b:
        return None
    u0, u1 = a[0][1], b[0][1]
    spent = {k: u1.get(k, 0) - u0.get(k, 0) for k in u1}
    tot = sum(spent.values())
    return 100 * spent.get(guest, 0) / tot if tot else None


def held(samples: list, t0: float, t1: float) -> dict[str, tuple[float, float, float]]:
    """Each guest's GPU time on the page between t0 and t1, as a part of the wall time (%), its
    turns per second and its work calls per second: what the scheduler charged, beside what the
    guest got done."""
    a = [s for s in samples if s[0] >= t0]
    b = [s for s in samples if s[0] >= t1] or samples[-1:]
    if not a or not b or b[0][0] <= a[0][0]:
        return {}
    (ta, ua, ca, na), (tb, ub, cb, nb) = a[0][:4], b[0][:4]
    dt = tb - ta
    return {
        k: (
            100 * (ub[k] - ua.get(k, 0)) / 1e9 / dt,
            (nb.get(k, 0) - na.get(k, 0)) / dt,
            (cb.get(k, 0) - ca.get(k, 0)) / dt,
        )
        for k in ub
    }


def held_text(h: dict[str, tuple[float, float, float]], names: list[str]) -> str:
    return "; held " + " / ".join(f"{h[n][0]:.1f}% ({h[n][1]:.0f} turns/s)" for n in names if n in h) if h else ""


@contextlib.contextmanager
def cap_controlled(g: Guests, trace=None):
    """vmgpud's cap controller on g's page from now on (as it runs there from the forwarder's start:
    the guest is measured alone while it warms up too), what it holds every 0.5 s to `trace`; on
    leaving, the forwarders stopped."""
    ctl = cap_control.CapController(**CAP_PROBE)

    def control(stop):
        t0, last, fines = time.monotonic(), -1.0, {}
        if trace is not None:
            trace.write(f"(times from {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d})\n")
        with g.page() as pg:
            while not cap_control.wait(stop, cap_control.PERIOD_STEP_S, [(pg, ctl)]):
                now = time.monotonic()
                cap_control.apply_step(pg, ctl, now)
                for name, c in ctl.guests.items() if trace is not None else ():
                    if c.fine is not fines.get(name, c.fine) and fines[name]:  # (a probe's samples, read)
                        trace.write(f"{now - t0:6.1f} {name} probe's calls per 10 ms: {per_bin(fines[name], 0.01)}\n")
                    fines[name] = c.fine
                if trace is not None and now - last >= 0.5:
                    last = now
                    for name, c in ctl.guests.items():
                        trace.write(
                            f"{now - t0:6.1f} {name} part {c.pm} alone {c.alone:.0f} reads "
                            f"{[round(r) for r in c.reads]} k {c.k:.3f} debt {c.debt:+.4f} bound {c.bound}"
                            f"{' probe' if c.probe_at is not None else ''}"
                            f"{' changed' if c.out_of_band or ctl.shifted(c) else ''} last read (ends, bursts) "
                            f"{c.last_read[0]:.0f} {c.last_read[1]:.0f}\n"
                        )

    try:
        with on_a_thread(control):
            yield ctl
    finally:
        g.stop()


def caps(g: Guests, run: Run, rows, summary, solo: float, seconds: float, trace=None) -> None:
    """A trainer alone capped at 10% and at 50%: under the cap controller, measured after its
    --cap-lead (cap_err_pp), and by time alone (cap_err_pp_time); each row with the GPU time the
    page charged it.  A share is the trainer's rate capped over its rate alone in the same process:
    right after its capped window its cap is lifted live and it runs another (a trainer alone
    varied by up to 20% from one process's 12-20 s to the next's on an H200, so a rate alone of
    another process says little of this one's).  The rates over the run's first rate alone and, where
    measured (not --skip capsolo), one measured just before that cap's rows are in each row too."""
    errs: dict[str, list[float]] = {"": [], "_time": []}
    if trace is not None and "capalone" not in SKIP:
        # how its rate alone moves after the go, natively and through vmgpu
        trace.write("== the trainer alone, uncapped, its lead and two windows\n")
        env = g.env()  # (its forwarder first: the controller opens its page)
        with cap_controlled(g, trace):
            c, c_held = capped_then_alone(g, run, env, CAP_LEAD[0], seconds, trace, each=2.0)
        args = [*CAP_TRAIN, "--lead", str(CAP_LEAD[0]), "--then-seconds", str(seconds), "--each", "2"]
        (n,) = run.together([(args, native_env())])
        for what, out, extra in (("vmgpu", c, c_held), ("native", n, "")):
            each = sorted(out.get("each") or [0.0])
            trace.write(f"{what} trainer alone, img/s over each 2 s from the go: {out.get('each')}\n")
            rows.append(
                (
                    f"trainer alone ({what}) after {CAP_LEAD[0]:.0f} s, then again",
                    f"{out['img_per_s']:.1f}, {out['img_per_s_then']:.1f} img/s; over each 2 s from the go "
                    f"{each[0]:.0f}-{each[len(each) // 2]:.0f}-{each[-1]:.0f} (least, median, most){extra}",
                )
            )
    for cap in CAPS:
        ref = solo
        if "capsolo" not in SKIP:
            (c,), _ = sampled(g, run, [(CAP_TRAIN, g.env())], seconds)
            g.stop()
            ref = (solo + c["img_per_s"]) / 2 if CAP_TRAIN == TRAIN else c["img_per_s"]  # (solo: TRAIN's)
            alone = f"{c['img_per_s']:.1f} ({solo:.1f}) img/s"
            rows.append((f"cap {cap}%: trainer alone just before (and the first)", alone))
        shares = []
        for i in range(CAP_RUNS[0]):
            env = g.env("--cap", str(cap))
            if trace is not None:
                trace.write(f"== cap {cap}% under the cap controller\n")
            with cap_controlled(g, trace) as ctl:
                c, c_held = capped_then_alone(g, run, env, CAP_LEAD[0], seconds, trace, ctl=ctl)
            shares.append(100 * c["img_per_s"] / c["img_per_s_then"])
            what = f"cap {cap}% alone, its progress held (cap controller){f' ({i + 1})' if CAP_RUNS[0] > 1 else ''}"
            rows.append((f"{what}: share", f"{shares[-1]:.1f}%{other_rates(c, ref)}" + c_held))
        if len(shares) > 1:
            rows.append(
                (f"cap {cap}% alone, cap controller: mean of {len(shares)}", f"{sum(shares) / len(shares):.1f}%")
            )
        errs[""].append(abs(sum(shares) / len(shares) - cap))
        if "captime" in SKIP:
            continue
        c, c_held = capped_then_alone(g, run, g.env("--cap", str(cap)), 0.0, seconds, trace)
        g.stop()
        share = 100 * c["img_per_s"] / c["img_per_s_then"]
        errs["_time"].append(abs(share - cap))
        rows.append(
            (f"cap {cap}% alone, its time held (no controller): share", f"{share:.1f}%{other_rates(c, ref)}" + c_held)
        )
    for suffix, e in errs.items():
        if e:
            summary[f"cap_err_pp{suffix}"] = max(e)


def other_rates(c: dict, ref: float) -> str:
    """A capped trainer's rate over the rates alone of other processes (where they ran its arguments)."""
    return f" (of the other rates alone: {100 * c['img_per_s'] / ref:.1f}%)" if CAP_TRAIN == TRAIN else ""


def per_bin(samples: list[tuple[float, int]], bin_s: float) -> list[int]:
    """(t, calls) samples' calls in each bin_s from the first sample on, to the last whole bin's
    end: the count at each bin's end read between the samples about it (a sample past several
    bins' ends is spread over them)."""
    out, at = [], samples[0][1] if samples else 0
    for (ta, ca), (tb, cb) in zip(samples, samples[1:], strict=False):
        while tb - samples[0][0] >= (len(out) + 1) * bin_s:
            end = samples[0][0] + (len(out) + 1) * bin_s
            c = ca + (cb - ca) * (end - ta) / (tb - ta) if tb > ta else cb
            out.append(round(c - at))
            at = c
    return out


def capped_then_alone(
    g: Guests, run: Run, env: dict, lead: float, seconds: float, trace=None, each: float = 0.0, ctl=None
) -> tuple[dict, str]:
    """The last guest of g (capped), a trainer run `lead` untimed, then `seconds` timed, then, its
    cap lifted live (`vmgpu cap GUEST GPU none`) as that window ends, `seconds` more: its output (img_per_s, and
    img_per_s_then, its rate alone in the same process) and what the page charged it over the
    capped window, as text, with its calls per second then and alone after (its calls per half
    second to `trace`).  ctl: the cap controller holding it, whose read of its rate alone as the
    cap is lifted is said beside those (what it held the guest to, and how far that read was off)."""
    name, samples, read, marks, done = g.names[-1], [], [], {}, threading.Event()
    between = run.tmp / f"between-{name}-{time.monotonic_ns()}"

    def lift():  # (once its first window is over: no step of either window runs on the other side)
        while not done.wait(0.002):
            if Path(f"{between}.ready").exists():
                try:
                    held = ctl.guests.get(name) if ctl is not None else None
                    if held is not None:
                        read.append(held.alone)
                    with g.page() as pg:
                        pg.set_cap(name, 0)
                    marks["lift"] = time.monotonic()
                finally:
                    between.touch()  # (the trainer goes on whatever happened here)
                return

    def at_go(t0):
        marks["go"] = t0
        threading.Thread(target=lift, daemon=True).start()

    args = [*CAP_TRAIN, "--lead", str(lead), "--then-seconds", str(seconds), "--between", str(between)]
    try:
        (out,), _ = sampled_held(
            g, run, [([*args, *(["--each", str(each)] if each else [])], env)], seconds, lead, at_go, samples
        )
    finally:
        done.set()
    at = marks.get("lift", marks["go"] + lead + seconds)
    h, then = held(samples, at - seconds + 0.5, at - 0.5), held(samples, at + 0.5, at + seconds - 0.5)
    calls = ""
    if name in h and name in then:  # (what the controller holds: calls, over its calls alone then)
        capped, alone = h[name][2], then[name][2]
        calls = f"; calls {capped:.0f}/s capped, {alone:.0f}/s alone then ({100 * capped / alone:.1f}%)"
        if read and read[0] > 0:
            calls += (
                f"; its rate alone as the controller read it {read[0]:.0f}/s (held to {100 * capped / read[0]:.1f}% "
                f"of that; the read {100 * read[0] / alone:.1f}% of its rate alone then)"
            )
    if trace is not None:
        t0 = marks["go"]
        rates = [round(r) for r in per_bin([(t - t0, c[name]) for t, _, c, *_ in samples if name in c], 0.5)]
        trace.write(f"{name}'s calls per 0.5 s from the go (lead {lead} s, capped {seconds} s, then alone): {rates}\n")
    return out, held_text(h, [name]) + calls


def sampled_held(
    g: Guests, run: Run, guests: list, seconds: float, lead: float = 0.0, at_go=None, keep: list | None = None
) -> tuple[list[dict], dict]:
    """run.together(guests) with the page sampled: their results and what the page charged them
    over their measured seconds, after a lead (held(), leaving out the first and last half second).
    at_go(t0): run at the go too; keep: the samples added to it."""
    s, marks = Sampler(g, 0.05), {}

    def during(t0):
        marks["t0"] = t0
        s.start(t0)
        if at_go:
            at_go(t0)

    try:
        out = run.together(guests, during)
    finally:
        samples = s.done()
    if keep is not None:
        keep.extend(samples)
    return out, held(samples, marks["t0"] + lead + 0.5, marks["t0"] + lead + seconds - 0.5)


def sampled(g: Guests, run: Run, guests: list, seconds: float, lead: float = 0.0) -> tuple[list[dict], str]:
    """sampled_held, what the page charged said as text."""
    names = g.names[-len(guests) :]
    out, h = sampled_held(g, run, guests, seconds, lead)
    return out, held_text(h, names)


def converge_s(samples: list, change_at: float, end: float, guest: str, target: float, window: float = 0.25) -> float:
    """From the change, the end of the first window (250 ms) in which `guest`'s GPU-time share on
    the page is within 2 pp of target, and from which on, to `end` (while both guests run), its
    share is too; inf if none."""
    t = change_at
    while t + window <= end:
        w = _share(samples, t, t + window, guest)
        rest = _share(samples, t + window, end, guest)
        if w is not None and rest is not None and abs(w - target) <= 2 and abs(rest - target) <= 2:
            return t + window - change_at
        t += window / 5
    return float("inf")


def reclaim_ms(samples: list, stayer: str, leaver: str) -> float:
    """From the leaver's last call that put work on the GPU (its work_calls on the page stop
    moving) to the first sample after it where the stayer's GPU time grows as fast as the clock
    (90%)."""
    i_leave = last_call(samples, leaver)
    if i_leave is None:
        return float("nan")
    last = samples[i_leave - 1][0]
    for i in range(1, len(samples)):
        (t0, u0), (t1, u1) = samples[i - 1][:2], samples[i][:2]
        if t0 >= last and t1 > t0 and (u1.get(stayer, 0) - u0.get(stayer, 0)) / 1e9 >= 0.9 * (t1 - t0):
            return 1000 * (t0 - last)
    return float("inf")


def stopped(signum, _frame) -> None:
    """SIGTERM (a `timeout` around the bench): ended as an error is, so that every forwarder, guest
    and MPS daemon it started is stopped and its region files are removed on the way out."""
    sys.exit(f"bench-sharing: stopped by signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, stopped)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=40.0, help="inference requests per second (default 40)")
    ap.add_argument("--depth", type=int, help="the forwarders' --sched-depth (default: theirs)")
    ap.add_argument("--slice-ms", type=float, help="the scheduler's slice (default: the page's, 10 ms)")
    ap.add_argument(
        "--idle-ms",
        type=float,
        help="how long a holder without work keeps the GPU while another waits (default: the page's, 2 ms)",
    )
    ap.add_argument("--period-ms", type=float, help="the period of caps (default: the page's, 100 ms)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma-separated scenarios to leave out (weights: the weighted pairs and the aggregate with its "
        "references; four, mps, shared, nomps (the shared row without MPS, where weights are skipped), priority, "
        "turnprio (its row under the weighted policy, by turns), "
        "sharedprio (the priority scenario under shared on MPS), ringhold (its rows held in the ring, not on "
        "spans), noclientprio (its row without MPS client "
        "priorities), sharedbelow (the shared pair on MPS with the light guest's MPS client priority below normal), "
        "refs (where weights are skipped: the shared rows' references, "
        "no-sched and native MPS 30/70), mpssame (native MPS at the thread limits that deliver the weights' "
        "tenant shares, found in up to two more windows: the reference at the same shares), cap, converge, "
        "reclaim, sharedconverge, sharedreclaim (converge and "
        "reclaim under shared, on MPS where it runs), capsolo (the rate alone measured next to each cap's "
        "rows), captime (the cap rows by time alone), capalone (with --trace: the trainer alone over its lead "
        "and two windows, natively and through vmgpu, before the cap rows), slowalone (where weights are "
        "skipped: three under shared at 30/70/10, the 10 honest and then slow whenever alone), aloneend "
        "(the trainer alone again at the end, through vmgpu and natively, against the start's), offspan (where "
        "weights are skipped: three under shared at 30/70/10, the 10 honest and then with a stream capture "
        "open, off its span))",
    )
    ap.add_argument(
        "--slow-alone",
        type=float,
        default=SLOW_ALONE[0],
        help="the slowalone rows' hostile guest goes at this part of its speed whenever it runs alone (default 0.3)",
    )
    ap.add_argument(
        "--depths",
        help="comma-separated depths: a trainer alone on MPS under shared held to each, and with --no-sched "
        "(what the depth costs one guest alone; run before the shared rows)",
    )
    ap.add_argument("--caps", default="10,50", help="the caps of the cap rows, comma-separated %% (default 10,50)")
    ap.add_argument(
        "--cap-lead",
        type=float,
        default=CAP_LEAD[0],
        help="seconds a trainer capped under the cap controller runs before its rate is measured (default 36)",
    )
    ap.add_argument(
        "--train",
        default=" ".join(TRAIN[1:]),
        help="the trainer's arguments in every row but the cap rows' (default '%(default)s': launch-bound, its "
        "rate alone moving 5-15%% between two processes and over tens of seconds on an H100; --train='--batch 64' "
        "leaves more of it to the GPU)",
    )
    ap.add_argument(
        "--cap-train",
        default=" ".join(TRAIN[1:]),
        help="the trainer's arguments in the cap rows (default '%(default)s': bound by its own Python, whose "
        "rate alone moves some 10%% over tens of seconds on an H200; --cap-train='--batch 64' leaves more of it "
        "to the GPU)",
    )
    ap.add_argument(
        "--cap-probe",
        help=f"the cap controller's probe, LENGTH,SETTLE seconds (default {cap_control.PROBE_S:g},"
        f"{cap_control.PROBE_SETTLE_S:g}; with --trace each probe's calls per 10 ms after its settle)",
    )
    ap.add_argument("--cap-runs", type=int, default=1, help="each cap's controller row this many times (default 1)")
    ap.add_argument(
        "--shared-lead",
        type=float,
        default=SHARED_LEAD[0],
        help="seconds the shared pair runs, its controller at work, before its rates are measured, and the "
        "sharedconverge pair before its measured seconds begin (default 8)",
    )
    ap.add_argument(
        "--prio-runs",
        type=int,
        default=1,
        help="run the sharedprio scenario this many times each way, and each --prio-reserve row, each run after "
        "the first after a window of the inference guest alone, with the p99s of their requests pooled (default 1)",
    )
    ap.add_argument(
        "--prio-native",
        action="store_true",
        help="after the --prio-reserve rows, the same pair natively on MPS: the trainer on 100 minus the weight of "
        "the active threads at the client priority below normal (--prio-runs times, pooled the same way)",
    )
    ap.add_argument(
        "--alone-turns",
        type=int,
        default=0,
        metavar="N",
        help="after the denominators, the inference guest alone through vmgpu and natively by turns, N times each, "
        "with each window's slow requests and the host's steal (whether slow stretches follow vmgpu or the host)",
    )
    ap.add_argument(
        "--latencies",
        type=Path,
        help="a directory: each priority-reserve window's requests (arrival, latency) and the controller's looks "
        "are written there",
    )
    ap.add_argument(
        "--mps-refs",
        default="30/70",
        help="the shared rows' native MPS references, LIGHT/HEAVY active-thread percentages, comma-separated "
        "(default 30/70, the weights; a split whose parts come out at 30/70 compares equal delivered shares)",
    )
    ap.add_argument(
        "--shared-threads",
        default="",
        help="LIGHT/HEAVY,...: the shared pair on MPS again (time lever) with the light and heavy guests' MPS "
        "active-thread percentages at each (where the weights rows are skipped)",
    )
    ap.add_argument(
        "--yield-depths",
        default="",
        help="comma-separated depths: the sharedprio scenario again with the forwarders' --yield-depth at each",
    )
    ap.add_argument(
        "--prio-reserve",
        default="",
        help="comma-separated weights: the priority scenario under shared on MPS with the controller on the sms "
        "lever (the trainer on the SMs the inference guest's weight leaves it), the inference guest at each "
        "weight and the trainer at 100 minus it",
    )
    ap.add_argument(
        "--lever",
        default="time",
        help="how the shared rows' controller holds a guest back: the first part of each period (time), "
        "how much of its work the GPU has at once (depth: its part of --depth), or the SMs it runs on beside "
        "the others (sms: SM partitions, green contexts; smsfree: the same but the guest given most left on all of "
        "the SMs; smsover: partitions each reaching an eighth of the SMs into its neighbours'); time,sms runs "
        "the shared rows once with each, beside the same references",
    )
    ap.add_argument("--trace", type=Path, help="write what the shared policy's controller saw every 0.5 s to this file")
    ap.add_argument(
        "--overlap",
        type=float,
        default=share_control.OVERLAP,
        help=f"under --lever smsover: how far each span reaches into its neighbours', a part of the SMs "
        f"(default {share_control.OVERLAP})",
    )
    ap.add_argument("--probe", help="the share controller's probe, EVERY,LENGTH,SETTLE seconds (default 4,0.3,0.08)")
    ap.add_argument(
        "--young",
        help="the share controller's youth, SECONDS,PART: while a guest is young, rounds of probes every "
        "--probe's EVERY (4 s) or as often as leaves them PART of the time (default "
        f"{share_control.YOUNG_S:g},{share_control.YOUNG_PART:g}; 0,PART: no youth; none with --lone-probes, "
        "which has no rounds)",
    )
    ap.add_argument(
        "--lone-probes",
        action="store_true",
        help="the share controller probes one guest at a time, never in rounds (before session 54: each probe "
        "a gift to its guest over the window it falls in)",
    )
    ap.add_argument(
        "--own-alone",
        type=float,
        default=OWN_ALONE[0],
        help="seconds each guest of a shared row then runs alone in its own process, the light one first, the "
        "other idle: the pair's parts by each guest's own rate alone, beside the controller's (default 5; 0: none)",
    )
    a = ap.parse_args()
    if a.own_alone and not 1 <= a.own_alone <= 30:
        ap.error(f"--own-alone: 0 (none) or seconds from 1 to 30, not {a.own_alone:g}")
    OWN_ALONE[0] = a.own_alone
    if not 0 < a.slow_alone <= 1:
        ap.error(f"--slow-alone: a part of the guest's speed in (0, 1], not {a.slow_alone:g}")
    SLOW_ALONE[0] = a.slow_alone
    if not 0 <= a.overlap <= 1:
        ap.error(f"--overlap: a part of the SMs, 0 to 1, not {a.overlap}")
    OVERLAP[0] = a.overlap
    if a.probe:
        every, length, settle = (float(x) for x in a.probe.split(","))
        PROBE.update(probe_every_s=every, probe_s=length, settle_s=settle)
    if a.lone_probes:
        PROBE["rounds"] = False
    if a.young:
        try:
            young_s, young_part = (float(x) for x in a.young.split(","))
        except ValueError as e:
            ap.error(f"--young: SECONDS,PART ({e})")
        if not (0 <= young_s <= 600 and 0 < young_part < 1):
            ap.error(f"--young: SECONDS from 0 to 600 and a PART of the time between 0 and 1, not {a.young}")
        PROBE.update(young_s=young_s, young_part=young_part)
    if a.cap_probe:
        try:
            length, settle = (float(x) for x in a.cap_probe.split(","))
        except ValueError as e:
            ap.error(f"--cap-probe: LENGTH,SETTLE seconds ({e})")
        if not 0 <= settle < length <= 10:
            ap.error("--cap-probe: 0 <= SETTLE < LENGTH <= 10 seconds")
        CAP_PROBE.update(probe_s=length, settle_s=settle)
    SHARED_LEAD[0] = a.shared_lead
    if a.latencies:
        a.latencies.mkdir(parents=True, exist_ok=True)
    CAP_LEAD[0] = a.cap_lead
    CAP_TRAIN[:] = [TRAIN[0], *shlex.split(a.cap_train)]
    TRAIN[1:] = shlex.split(a.train)
    CAP_RUNS[0] = max(1, a.cap_runs)
    PRIO_RUNS[0] = max(1, a.prio_runs)
    try:
        YIELD_DEPTHS[:] = [int(y) for y in a.yield_depths.split(",") if y]
        SHARED_THREADS[:] = [tuple(int(x) for x in t.split("/")) for t in a.shared_threads.split(",") if t]
        MPS_REFS[:] = list(dict.fromkeys(tuple(int(x) for x in t.split("/")) for t in a.mps_refs.split(",") if t))
        PRIO_RESERVE[:] = [int(w) for w in a.prio_reserve.split(",") if w]
    except ValueError as e:
        ap.error(f"--yield-depths, --shared-threads, --mps-refs or --prio-reserve: {e}")
    if not all(1 <= y <= 1024 for y in YIELD_DEPTHS):
        ap.error("--yield-depths: each in 1..1024")
    if not all(1 <= w <= 99 for w in PRIO_RESERVE):
        ap.error("--prio-reserve: each weight in 1..99")
    if a.alone_turns < 0:
        ap.error("--alone-turns: a number of turns, 0 or more")
    if a.prio_native and not PRIO_RESERVE:
        ap.error("--prio-native: it runs beside the --prio-reserve rows; give --prio-reserve")
    if a.prio_native and {"priority", "sharedprio", "mps"} & set(filter(None, a.skip.split(","))):
        ap.error("--prio-native: it needs the priority, sharedprio and mps scenarios (MPS): do not skip them")
    if not MPS_REFS or not all(len(t) == 2 and all(1 <= x <= 100 for x in t) for t in MPS_REFS):
        ap.error("--mps-refs: LIGHT/HEAVY percentages in 1..100, comma-separated")
    if len({t[0] for t in MPS_REFS}) != len(MPS_REFS):
        ap.error("--mps-refs: one split per light percentage (their summary keys are named by it)")
    if not all(len(t) == 2 and all(1 <= x <= 100 for x in t) for t in SHARED_THREADS):
        ap.error("--shared-threads: LIGHT/HEAVY percentages in 1..100, comma-separated")
    if len({t[0] for t in SHARED_THREADS}) != len(SHARED_THREADS):
        ap.error("--shared-threads: one pair per light percentage (their rows are named by it)")
    LEVERS[:] = list(dict.fromkeys(a.lever.split(",")))  # (each once)
    if not LEVERS or set(LEVERS) - set(share_control.LEVERS):
        ap.error(f"--lever: one or more of {', '.join(share_control.LEVERS)}, comma-separated")
    if a.overlap != share_control.OVERLAP and "smsover" not in LEVERS:
        ap.error("--overlap: only --lever smsover's spans reach into each other's")
    skip = set(filter(None, a.skip.split(",")))
    SKIP.update(skip)
    CAPS[:] = [int(x) for x in a.caps.split(",") if x]
    CLIENT_PRIO_OFF[0] = "noclientprio" not in skip
    tmp = Path(tempfile.mkdtemp(prefix="vmgpu-sharing-"))
    run = Run(tmp, a.seconds)
    ms = {"slice_us": a.slice_ms, "idle_us": a.idle_ms, "period_us": a.period_ms}
    g = Guests(tmp, a.depth, {word: int(v * 1000) for word, v in ms.items() if v})
    infer = INFER + ["--rate", str(a.rate)]
    rows, summary = Rows(), {}
    rows.append(("trainer", " ".join(TRAIN)))
    trace = open(a.trace, "w") if a.trace else None  # noqa: SIM115 - closed with the run
    try:
        # alone: the denominators
        (train_alone,), alone_held = sampled(g, run, [(TRAIN, g.env())], a.seconds)
        g.stop()
        (train_native,) = run.together([(TRAIN, native_env())])
        solo, native_solo = train_alone["img_per_s"], train_native["img_per_s"]
        rows.append(("trainer alone (vmgpu / native)", f"{solo:.1f} / {native_solo:.1f} img/s" + alone_held))
        if "priority" not in skip:  # (only the priority scenario needs the inference guest alone)
            alone_file = tmp / "alone-1.txt"
            (infer_alone,) = run.together([(infer + ["--latencies", str(alone_file)], g.env())])
            infer_alone["file"] = alone_file
            g.stop()
            native_file = tmp / "native-alone-1.txt"
            (infer_native,) = run.together([(infer + ["--latencies", str(native_file)], native_env())])
            infer_native["file"] = native_file
            rows.append(
                (
                    f"inference alone natively at {a.rate:g}/s p50 / p99",
                    f"{infer_native['p50_ms']:.2f} / {infer_native['p99_ms']:.2f} ms",
                )
            )
            steal_row(rows, "inference alone natively", infer_native)
            rows.append(
                (
                    f"inference alone at {a.rate:g}/s p50 / p99, busy",
                    f"{infer_alone['p50_ms']:.2f} / {infer_alone['p99_ms']:.2f} ms, {100 * infer_alone['busy']:.1f}%",
                )
            )
            steal_row(rows, "inference alone", infer_alone)
        if a.alone_turns:
            alone_turns(g, run, rows, summary, infer, a.alone_turns, a.latencies)

        if "weights" not in skip:  # two trainers at 30/70 (and four), beside no-sched, native and MPS
            # two trainers at 30/70
            (w30, w70), w_held = sampled(
                g, run, [(TRAIN, g.env("--weight", "30")), (TRAIN, g.env("--weight", "70"))], a.seconds
            )
            g.stop()
            rates = [w30["img_per_s"], w70["img_per_s"]]
            weighted_total = sum(rates)
            errs = [pair_row(rows, "weights 30/70", rates, solo, w_held)]

            if "four" not in skip:
                ws = [10, 20, 30, 40]
                four = run.together([(TRAIN, g.env("--weight", str(w))) for w in ws])
                g.stop()
                err4, parts4 = normalised_err([f["img_per_s"] for f in four], solo, ws)
                errs.append(err4)
                rows.append(
                    (
                        "weights 10/20/30/40: normalised shares",
                        " / ".join(f"{p:.1f}" for p in parts4)
                        + f" (together {sum(f['img_per_s'] for f in four) / solo:.2f})",
                    )
                )
            summary["share_max_err_pp"] = max(errs)

            nosched_total = nosched_pair(g, run)
            summary["aggregate_vs_nosched"] = weighted_total / nosched_total
            x1, x2 = run.together([(TRAIN, native_env()), (TRAIN, native_env())])
            native_pair = (x1["img_per_s"] + x2["img_per_s"]) / native_solo
            summary["aggregate_vs_native"] = (weighted_total / solo) / native_pair
            agg = f"weights {weighted_total / solo:.2f}, no-sched {nosched_total / solo:.2f}, native {native_pair:.2f}"

            mps = mps_start(tmp) if "mps" not in skip else None
            same = None  # the pair's total natively on MPS at the weights' tenant shares
            if mps:
                try:
                    m30, m70 = native_mps_pair(run, mps)  # (at the weights)
                    if "mpssame" not in skip:
                        found = mps_same_shares(
                            run, mps, rows, native_solo, {(30, 70): [m30["img_per_s"], m70["img_per_s"]]}
                        )
                        same = same_shares_row(rows, summary, found)
                    pipe = mps["CUDA_MPS_PIPE_DIRECTORY"]
                    envs = [
                        (TRAIN, g.env("--mps", pipe, "--mps-threads", "30")),
                        (TRAIN, g.env("--mps", pipe, "--mps-threads", "70")),
                    ]
                    g.policy("native")  # no turns: the thread limits are the shares
                    v30, v70 = run.together(envs)
                    g.policy("weighted")
                    g.stop()
                    for lever in LEVERS if "shared" not in skip else ():
                        shared_pair(g, run, rows, summary, solo, pipe, trace, lever=lever)
                        if "sharedbelow" not in skip:
                            shared_pair(g, run, rows, summary, solo, pipe, trace, light_below=True, lever=lever)
                finally:
                    mps_stop(mps)
                mps_total = (m30["img_per_s"] + m70["img_per_s"]) / native_solo
                vm_mps_total = (v30["img_per_s"] + v70["img_per_s"]) / solo
                e_vm = pair_row(rows, "vmgpu on MPS 30/70", [v30["img_per_s"], v70["img_per_s"]], solo)
                pair_row(rows, "MPS 30/70 (native)", [m30["img_per_s"], m70["img_per_s"]], native_solo)
                summary["mps_share_err_pp"] = e_vm
                summary["aggregate_vs_mps"] = (weighted_total / solo) / mps_total
                if "mpssame" not in skip:
                    summary["aggregate_vs_mps_same_shares"] = (weighted_total / solo) / same if same else float("nan")
                summary["aggregate_vmgpu_mps_vs_mps"] = vm_mps_total / mps_total
                agg += f", vmgpu on MPS {vm_mps_total:.2f}, MPS (native) {mps_total:.2f}"
            else:
                summary["aggregate_vs_mps"] = float("nan")
                agg += ", MPS unavailable or skipped"
            if "shared" not in skip:
                shared_pair(g, run, rows, summary, solo, trace=trace)
                if "shared_total" in summary:
                    summary["aggregate_shared_vs_nosched"] = summary["shared_total"] * solo / nosched_total
                    if mps:
                        summary["aggregate_shared_vs_mps"] = summary["shared_total"] / mps_total
                        if "mpssame" not in skip:
                            summary["aggregate_shared_vs_mps_same_shares"] = (
                                summary["shared_total"] / same if same else float("nan")
                            )
                    agg += f", shared on MPS {summary['shared_total']:.2f}"
                agg += f", shared without MPS {summary['shared_total_no_mps']:.2f}"
            rows.append(("aggregate, of one guest alone", agg))

        hostile = "slowalone" not in skip or "offspan" not in skip
        if "weights" in skip and ("shared" not in skip or a.depths or hostile):  # (no references)
            mps = mps_start(tmp) if "mps" not in skip else None
            agg = "shared"
            if mps:
                try:
                    if a.depths:
                        depths = [int(d) for d in a.depths.split(",")]
                        depth_rows(g, run, rows, solo, depths, mps["CUDA_MPS_PIPE_DIRECTORY"], a.seconds)
                    pipe = mps["CUDA_MPS_PIPE_DIRECTORY"]
                    for lever in LEVERS if "shared" not in skip else ():
                        by = lever_key(lever)
                        shared_pair(g, run, rows, summary, solo, pipe, trace, lever=lever)
                        agg += (
                            f"{',' if lever != LEVERS[0] else ''} on MPS by {lever} {summary[f'shared_total{by}']:.2f}"
                        )
                        if "sharedbelow" not in skip:
                            shared_pair(g, run, rows, summary, solo, pipe, trace, light_below=True, lever=lever)
                            agg += f", light guest below normal {summary[f'shared_total{by}_light_below']:.2f}"
                    for th in SHARED_THREADS if "shared" not in skip else ():
                        shared_pair(g, run, rows, summary, solo, pipe, trace, threads=th)
                        agg += f", threads {th[0]}/{th[1]} {summary[f'shared_total_threads{th[0]}']:.2f}"
                    for lever in LEVERS if "slowalone" not in skip else ():
                        slow_alone_rows(g, run, rows, summary, solo, pipe, trace, lever)
                    for lever in LEVERS if "offspan" not in skip else ():
                        off_span_rows(g, run, rows, summary, solo, pipe, trace, lever)
                finally:
                    mps_stop(mps)
            if "shared" not in skip and "nomps" not in skip:
                shared_pair(g, run, rows, summary, solo, trace=trace)
                agg += f", without MPS {summary['shared_total_no_mps']:.2f}"
            if "shared" not in skip and "refs" not in skip:
                agg += shared_references(g, run, rows, summary, solo, native_solo, tmp, "mps" not in skip)
            if "shared" not in skip:
                rows.append(("aggregate, of one guest alone", agg))

        if "priority" not in skip and "turnprio" not in skip:
            hp, tr = run.together([(infer, g.env("--priority", "high")), (TRAIN, g.env())])
            g.stop()
            priority_rows(rows, summary, hp, tr, infer_alone, solo, "priority", "")

        if "priority" not in skip and "sharedprio" not in skip:
            mps = mps_start(tmp) if "mps" not in skip else None
            if mps:
                try:
                    pipe = mps["CUDA_MPS_PIPE_DIRECTORY"]
                    reserve_priority(g, run, rows, summary, infer, infer_alone, solo, pipe, a.latencies)
                    if a.prio_native:
                        native_reserve_priority(run, rows, summary, infer, infer_native, native_solo, pipe, a.latencies)
                    if "ringhold" not in skip:
                        shared_priority(g, run, rows, summary, infer, infer_alone, solo, pipe)
                finally:
                    mps_stop(mps)

        if "cap" not in skip:
            caps(g, run, rows, summary, solo, a.seconds, trace)

        if "converge" not in skip:
            envs = [(TRAIN, g.env("--weight", "50")), (TRAIN, g.env("--weight", "50"))]
            first, second = g.names
            s = Sampler(g, 0.01)
            change = [None, lambda pg: (pg.set_weight(first, 20), pg.set_weight(second, 80))]
            marks = {}

            def during(t0, s=s, change=change, marks=marks):
                change[0] = t0 + a.seconds / 2
                marks["at"], marks["end"] = change[0], t0 + a.seconds - 0.2
                s.start(t0, change)

            run.together(envs, during)
            g.stop()
            summary["converge_s"] = converge_s(s.done(), marks["at"], marks["end"], first, 20)
            rows.append(("weights 50/50 -> 20/80 live: converged", f"{summary['converge_s']:.2f} s"))

        if "reclaim" not in skip:
            envs = [(TRAIN, g.env()), (TRAIN + ["--seconds", str(a.seconds / 2)], g.env())]
            stayer, leaver = g.names
            s = Sampler(g, 0.001)
            run.together(envs, lambda t0, s=s: s.start(t0))
            g.stop()
            summary["reclaim_ms"] = reclaim_ms(s.done(), stayer, leaver)
            rows.append(("a guest stops: the other holds the GPU after", f"{summary['reclaim_ms']:.1f} ms"))
        if "sharedconverge" not in skip or "sharedreclaim" not in skip:
            mps = mps_start(tmp) if "mps" not in skip else None
            try:
                pipe = mps["CUDA_MPS_PIPE_DIRECTORY"] if mps else None
                if "sharedconverge" not in skip:
                    shared_converge(g, run, rows, summary, a.seconds, pipe, trace)
                if "sharedreclaim" not in skip:
                    shared_reclaim(g, run, rows, summary, a.seconds, pipe, trace)
            finally:
                if mps:
                    mps_stop(mps)
        if "aloneend" not in skip:
            alone_again(g, run, rows, summary, solo, native_solo)
    finally:
        g.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if trace:
            trace.close()
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print("sharing " + " ".join(f"{k}={v:.3f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
