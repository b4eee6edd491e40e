#!/usr/bin/env python3
"""Which CUDA driver functions and export tables do the GPU test programs use that vmgpu does not serve?

Runs every program the GPU tests run natively (tests/gpu/programs.py) on this host's real driver
under the driver-call census (an LD_PRELOAD interposer kept outside the repository: CENSUS_DIR,
built into build/census/ on first use with its gen_stubs.py and gcc), one TSV per program in
build/census/, and compares what each used with what the guest library serves:

- a function is served when api.toml names it (any class), or it is the `_ptds`/`_ptsz` variant of
  one that the driver exports; a base name a program asked cuGetProcAddress for is served when every
  symbol the probed driver answers for it at its newest version (driver/procaddr.tsv) is served;
- an export table is served or declined when export_tables.toml has its UUID (slots or an object:
  served; `refuse`: declined as the driver declines it); any other is unserved.

Only functions a program called count (the census lists entry points obtained and never called
with a count of 0); every export table a program asked for counts.  A program linked to libcuda
itself (the driver-API C programs) calls the driver past the census, which sees only dlsym and
cuGetProcAddress: for such an ELF program the driver functions it imports (`nm -D
--undefined-only`, binutils) count as used, shown as `linked` (<name>.linked in the output).  Prints a table per program
and a last line `census programs=N unserved_functions=K unserved_export_tables=E` (distinct names
over the programs).  Exit status 0, or with --strict 1 when K+E > 0 or a program failed; 2 when
the census could not run.

    python3 bench/census.py [--census-dir DIR] [--strict] [PROGRAM ...]
    python3 bench/census.py --from-dir build/census        # the last run's TSVs again, not rerun
    python3 bench/census.py --run myapp='python3 app.py'   # a program of your own instead
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_API = ROOT / "native" / "cuda_api"
sys.path[:0] = [str(ROOT), str(CUDA_API)]

from generator.exports import load_exports  # noqa: E402
from generator.guest import read_procaddr  # noqa: E402
from generator.spec import read_exports, variants  # noqa: E402

from tests.gpu.programs import PROGRAMS, TWO_GPUS, gpu_count, native_env  # noqa: E402

DEFAULT_CENSUS_DIR = ROOT.parent / "shared" / "tools" / "census"
DEFAULT_OUT = ROOT / "build" / "census"
PER_PROCESS = ROOT / "bench" / "census_pid.c"  # built into the census library: a census file per process
DRIVER_FUNCTION = re.compile(r"cu[A-Z]\w*")  # cuda*, cublas*, cudnn* ... are libraries', not the driver's
EXPORT_TABLE = re.compile(r"EXPORT_TABLE_([0-9a-f]{32})")
DRIVER_ANSWER = re.compile(r"\[census\] cuGetExportTable ([0-9a-f]{32}) -> (-?\d+)")
PROGRAM_NAME = re.compile(r"[\w.-]+")


class CensusError(Exception):
    """The census could not run (exit status 2)."""


# ---- what vmgpu serves ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Served:
    functions: frozenset[str]  # the guest library's served symbols
    procaddr: dict[str, frozenset[str]]  # base name -> the symbols the driver answers at its newest version
    tables: dict[str, str]  # export table UUID (32 hex digits) -> "served" or "declined"


def newest_answers(rows) -> dict[str, frozenset[str]]:
    """Per base name, the symbols cuGetProcAddress answers at the newest version that gives one,
    for each flag (default, legacy stream, per-thread stream); rows as read_procaddr gives them."""
    newest: dict[tuple[str, int], tuple[int, str]] = {}
    for base, flag, version, answer in rows:
        if not base or answer.startswith(("!", "?")):
            continue
        if (base, flag) not in newest or version > newest[base, flag][0]:
            newest[base, flag] = (version, answer)
    out: dict[str, set[str]] = {}
    for (base, _), (_, answer) in newest.items():
        out.setdefault(base, set()).add(answer)
    return {base: frozenset(answers) for base, answers in out.items()}


def served_functions(names, exports) -> frozenset[str]:
    """The functions api.toml names and their per-thread variants the driver exports."""
    return frozenset(n for name in names for n in (name, *variants(name, exports)))


def load_served(api_toml: Path = CUDA_API / "api.toml") -> Served:
    with open(api_toml, "rb") as f:
        names = tomllib.load(f).get("fn", {})
    _, rows = read_procaddr()
    tables = {
        bytes(t["uuid"]).hex(): "declined" if "refuse" in t else "served"
        for t in load_exports(str(CUDA_API / "export_tables.toml"))
    }
    return Served(served_functions(names, read_exports()), newest_answers(rows), tables)


# ---- one program's census ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Usage:
    calls: dict[str, int]  # driver function -> calls (the census's rows of one name summed)
    tables: frozenset[str]  # export table UUIDs asked for


def parse_census(text: str, source: str = "census") -> Usage:
    """The census's `count<TAB>name` lines; names that are not driver functions are left out."""
    calls: dict[str, int] = {}
    tables: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        count, sep, name = line.partition("\t")
        if not sep or not count.isdigit() or not name:
            raise CensusError(f"{source}:{n}: not a census line (count<TAB>name): {line[:80]!r}")
        if m := EXPORT_TABLE.fullmatch(name):
            tables.add(m.group(1))
        elif DRIVER_FUNCTION.fullmatch(name):
            calls[name] = calls.get(name, 0) + int(count)
    return Usage(calls, frozenset(tables))


@dataclasses.dataclass(frozen=True)
class Unserved:
    name: str
    calls: int
    needs: tuple[str, ...] = ()  # for a base name: the symbols the driver answers for it that are not served


def unserved_functions(usage: Usage, served: Served) -> list[Unserved]:
    """Every function called at least once that the guest library does not serve, most called first."""
    out = []
    for name, calls in usage.calls.items():
        # a base name is what cuGetProcAddress was asked for: served when what the driver answers is
        # (cuMemAlloc: cuMemAlloc_v2); any other name is a symbol itself (dlsym's)
        answers = served.procaddr.get(name, frozenset([name]))
        if calls == 0 or answers <= served.functions:
            continue
        needs = tuple(sorted(answers - served.functions)) if name in served.procaddr else ()
        out.append(Unserved(name, calls, needs))
    return sorted(out, key=lambda u: (-u.calls, u.name))


def unserved_tables(usage: Usage, served: Served) -> list[str]:
    return sorted(u for u in usage.tables if u not in served.tables)


def driver_answers(log: str) -> dict[str, int]:
    """What the real driver answered each cuGetExportTable (the census's own log lines)."""
    return {m.group(1): int(m.group(2)) for m in DRIVER_ANSWER.finditer(log)}


# ---- the report -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    program: str
    status: int | None  # the exit status; None: it ran past the time limit
    census: str | None  # the TSV's text; None: the program wrote none
    log: str = ""  # its output (stdout and stderr)
    linked: tuple[str, ...] = ()  # the driver functions its ELF file imports from libcuda itself

    @property
    def failed(self) -> bool:
        return self.status != 0 or self.census is None


def why_failed(r: Result) -> str:
    what = "ran past the time limit" if r.status is None else f"exit status {r.status}"
    if r.status is not None and r.status < 0:
        what = f"killed by signal {-r.status}"
    if r.status == 0 and r.census is None:
        what = "no census written"
    lines = [ln for ln in r.log.splitlines() if ln.strip() and not ln.startswith("[census]")]
    return f"{what}: {lines[-1].strip()[:160]}" if lines else what


def report(results: list[Result], served: Served) -> tuple[list[str], set[str], set[str]]:
    """The table per program: its lines, and the distinct unserved functions and export tables."""
    lines: list[str] = []
    functions: set[str] = set()
    tables: set[str] = set()
    for r in results:
        if r.failed:
            lines.append(f"{r.program}: FAILED natively ({why_failed(r)})")
        if r.census is None:
            continue
        usage = parse_census(r.census, r.program)
        missing = unserved_functions(usage, served)
        called = {u.name for u in missing}
        missing_linked = [n for n in r.linked if n not in served.functions and n not in called]
        missing_tables = unserved_tables(usage, served)
        functions |= called | set(missing_linked)
        tables |= set(missing_tables)
        used = sum(1 for c in usage.calls.values() if c)
        linked = f", {len(r.linked)} linked" if r.linked else ""
        lines.append(
            f"{r.program}: {used} driver functions called{linked}, {len(usage.tables)} export tables asked for; "
            f"unserved: {len(missing) + len(missing_linked)} functions, {len(missing_tables)} export tables"
        )
        if not used and not usage.tables and not r.linked:
            # each process writes its census as it exits: one that ends by _exit or a signal writes none
            lines.append("  nothing recorded: no process of it that used the GPU exited normally")
        if missing or missing_linked or missing_tables:
            lines.append(f"  {'calls':>10}  unserved")
        for u in missing:
            needs = f"  (serve {', '.join(u.needs)})" if u.needs and u.needs != (u.name,) else ""
            lines.append(f"  {u.calls:>10}  {u.name}{needs}")
        for name in missing_linked:
            lines.append(f"  {'linked':>10}  {name}")
        answers = driver_answers(r.log)
        for uuid in missing_tables:
            rc = f"  (the driver answered {answers[uuid]})" if uuid in answers else ""
            lines.append(f"  {'-':>10}  export table {uuid}{rc}")
    return lines, functions, tables


def summary(results: list[Result], functions: set[str], tables: set[str]) -> str:
    return f"census programs={len(results)} unserved_functions={len(functions)} unserved_export_tables={len(tables)}"


# ---- running the programs ---------------------------------------------------------------------


def build_census(census_dir: Path, out: Path) -> Path:
    """The census library in out/, built from census_dir unless built from what is there now."""
    sources = [census_dir / "census.c", census_dir / "gen_stubs.py", PER_PROCESS]
    for s in sources:
        if not s.is_file():
            raise CensusError(f"{s} not found: pass the census tool's directory (CENSUS_DIR= or --census-dir)")
    lib = out / "libcensus.so"
    if lib.exists() and lib.stat().st_mtime >= max(s.stat().st_mtime for s in sources):
        return lib
    out.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "gcc")
    steps = [
        [sys.executable, str(census_dir / "gen_stubs.py")],
        [cc, "-O2", "-shared", "-fPIC", "-o", "libcensus.so.new", str(sources[0]), "stubs.S", str(PER_PROCESS)]
        + ["-ldl", "-lpthread"],
    ]
    for step in steps:
        try:
            r = subprocess.run(step, cwd=out, capture_output=True, text=True)
        except OSError as e:
            raise CensusError(f"building the census in {out}: {step[0]}: {e.strerror}") from e
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise CensusError(f"building the census in {out}: {shlex.join(step)} failed: {last}")
    os.replace(out / "libcensus.so.new", lib)
    return lib


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None


def create(path: Path):
    """A new file, never through a link someone left in its place."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w")


def linked_functions(program: Path) -> tuple[str, ...]:
    """The driver functions an ELF program imports itself (its undefined dynamic symbols), sorted;
    () for anything else (a script, an interpreter's name on the PATH)."""
    try:
        with open(program, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return ()
    except OSError:
        return ()
    nm = shutil.which("nm")
    if not nm:
        raise CensusError(f"nm not found (binutils): needed to read what {program} imports from libcuda")
    r = subprocess.run([nm, "-D", "--undefined-only", str(program)], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise CensusError(f"nm -D --undefined-only {program} failed: {last}")
    names = {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.strip()}
    return tuple(sorted(n for n in names if DRIVER_FUNCTION.fullmatch(n)))


def read_linked(path: Path) -> tuple[str, ...]:
    text = read_text(path)
    return tuple(ln for ln in text.splitlines() if DRIVER_FUNCTION.fullmatch(ln)) if text else ()


def run_program(name: str, argv: list, lib: Path, out: Path, timeout: float) -> Result:
    """One program natively under the census: out/<name>.tsv, .log (its output), .exit, and
    .linked (the driver functions it imports, for an ELF program linked to libcuda)."""
    tsv, log, status_file, linked_file = (out / f"{name}{ext}" for ext in (".tsv", ".log", ".exit", ".linked"))
    for stale in (tsv, log, status_file, linked_file):
        stale.unlink(missing_ok=True)  # a program that writes none must not be read as its last run
    linked = linked_functions(Path(str(argv[0])))
    procs = fresh_dir(out / f"{name}.procs")  # one census file per process (census_pid.c)
    if linked:
        with create(linked_file) as f:
            f.write("".join(f"{n}\n" for n in linked))
    preload = " ".join(filter(None, [str(lib), os.environ.get("LD_PRELOAD")]))
    env = native_env(LD_PRELOAD=preload, CENSUS_OUT=str(tsv), CENSUS_OUT_DIR=str(procs))
    with create(log) as f:
        try:
            p = subprocess.Popen(
                [str(a) for a in argv], env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as e:
            f.write(f"{argv[0]}: {e.strerror}\n")
            status: int | None = 127
        else:
            try:
                status = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the program and what it started (its session)
                p.wait()
                status = None
    with create(status_file) as f:
        f.write(f"{'timeout' if status is None else status}\n")
    join_processes(procs, tsv)
    return Result(name, status, read_text(tsv), read_text(log) or "", linked)


def fresh_dir(path: Path) -> Path:
    """An empty directory of this run's at path: a link or file there is removed, not followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)  # a link, a file, a FIFO: never followed
    path.mkdir(mode=0o700)
    return path


def join_processes(procs: Path, tsv: Path) -> None:
    """The census files of a program's processes as one (<name>.tsv), the directory removed; no
    file when no process wrote one (a program killed before it exited)."""
    files = sorted((p for p in procs.iterdir() if p.is_file() and not p.is_symlink()), key=lambda p: p.name)
    texts = [p.read_text(errors="replace") for p in files]
    if (direct := read_text(tsv)) is not None:  # (the census library built without census_pid.c)
        texts.insert(0, direct)
        tsv.unlink()
    if files or direct is not None:
        with create(tsv) as f:
            f.write("".join(t if not t or t.endswith("\n") else t + "\n" for t in texts))
    shutil.rmtree(procs)


def read_results(directory: Path, names: list[str]) -> list[Result]:
    """A run's results from its files (<name>.tsv, .log, .exit), not rerun."""
    found = sorted({p.stem for p in directory.glob("*.tsv")} | {p.stem for p in directory.glob("*.exit")})
    if not found:
        raise CensusError(f"{directory}: no census files (<program>.tsv); run `make census` first")
    for n in names:
        if n not in found:
            raise CensusError(f"{directory}: no census of {n} (there: {', '.join(found)})")
    results = []
    for n in names or found:
        status_text = (read_text(directory / f"{n}.exit") or "0").strip()
        status = None if status_text == "timeout" else int(status_text)
        results.append(
            Result(
                n,
                status,
                read_text(directory / f"{n}.tsv"),
                read_text(directory / f"{n}.log") or "",
                read_linked(directory / f"{n}.linked"),
            )
        )
    return results


def programs_to_run(names: list[str], runs: list[str]) -> dict[str, list]:
    if runs:
        chosen = {}
        for spec in runs:
            name, sep, command = spec.partition("=")
            if not sep or not PROGRAM_NAME.fullmatch(name) or not shlex.split(command):
                raise CensusError(f"--run {spec!r}: give NAME=COMMAND (NAME of letters, digits, '.', '_', '-')")
            chosen[name] = shlex.split(command)
        return chosen
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        raise CensusError(f"no GPU test program {', '.join(unknown)}; the programs: {', '.join(PROGRAMS)}")
    return {n: PROGRAMS[n] for n in names} if names else dict(PROGRAMS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="census.py",
        description="The CUDA driver functions and export tables the GPU test programs use that vmgpu does not serve.",
    )
    ap.add_argument("programs", nargs="*", help="program names (default: every one; --list shows them)")
    ap.add_argument(
        "--census-dir",
        type=Path,
        default=Path(os.environ.get("CENSUS_DIR") or DEFAULT_CENSUS_DIR),
        help="the census tool's directory, with census.c and gen_stubs.py ($CENSUS_DIR, else ../shared/tools/census)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the census and the TSVs go (build/census)")
    ap.add_argument("--from-dir", type=Path, help="report a run's TSVs from this directory instead of running")
    ap.add_argument("--run", action="append", default=[], metavar="NAME=COMMAND", help="census this command instead")
    ap.add_argument("--timeout", type=float, default=900, help="seconds each program may run (900)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when anything is unserved or a program failed")
    ap.add_argument("--list", action="store_true", help="list the programs and exit")
    a = ap.parse_args(argv)
    if a.list:
        for name, args in PROGRAMS.items():
            print(f"{name}\t{shlex.join(str(x) for x in args)}")
        return 0
    not_run: list[str] = []
    try:
        served = load_served()
        if a.from_dir:
            results = read_results(a.from_dir, a.programs)
        else:
            chosen = programs_to_run(a.programs, a.run)
            lib = build_census(a.census_dir.resolve(), a.out)
            results = []
            gpus = gpu_count()
            if gpus < 2 and not a.run:
                not_run = [f"{n}: not run (it needs two GPUs; this host has {gpus})" for n in chosen if n in TWO_GPUS]
                chosen = {n: args for n, args in chosen.items() if n not in TWO_GPUS}
            for name, args in chosen.items():
                print(f"census: {name}: {shlex.join(str(x) for x in args)}", file=sys.stderr, flush=True)
                results.append(run_program(name, args, lib, a.out, a.timeout))
        lines, functions, tables = report(results, served)
    except CensusError as e:
        print(f"census: {e}", file=sys.stderr)
        return 2
    print("\n".join([*lines, *not_run, summary(results, functions, tables)]))
    failed = any(r.failed for r in results)
    return 1 if a.strict and (functions or tables or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
