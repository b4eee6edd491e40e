"""bench/census.py: what the GPU test programs use that vmgpu does not serve.  The comparison on
hand-made census rows, the repository's own spec read through the generator, and the command
line with a stand-in census library (no GPU, no census tool)."""

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.programs import PROGRAMS, SAME_OUTPUT

ROOT = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("census", ROOT / "bench" / "census.py")
census = sys.modules.setdefault("census", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(census)

TABLE_SERVED = "6bd5fb6c5bf4e74a8987d93912fd9df9"
TABLE_DECLINED = "f8cff95121468b4eb9e2fb469e7c0dd9"
TABLE_UNKNOWN = "69a28e9f000000000000000000000000"
ROWS = [
    ("cuMemAlloc", 0, 2000, "cuMemAlloc"),
    ("cuMemAlloc", 0, 3020, "cuMemAlloc_v2"),
    ("cuMemAlloc", 0, 13010, "!1/-1"),
    ("cuMemAlloc", 2, 3020, "cuMemAlloc_v2"),
    ("cuMemcpyAsync", 0, 4000, "cuMemcpyAsync"),
    ("cuMemcpyAsync", 2, 7000, "cuMemcpyAsync_ptsz"),
    ("cuMemsetD2D8Async", 0, 3020, "cuMemsetD2D8Async"),
    ("cuMemsetD2D8Async", 2, 7000, "cuMemsetD2D8Async_ptsz"),
    ("cuMemsetD8Async", 0, 3020, "cuMemsetD8Async"),
    ("cuMemsetD8Async", 2, 7000, "cuMemsetD8Async_ptsz"),
    ("", 0, 2000, "!0/1"),
]
EXPORTS = ["cuMemAlloc", "cuMemAlloc_v2", "cuMemcpyAsync", "cuMemcpyAsync_ptsz", "cuMemsetD2D8Async"]
EXPORTS += ["cuMemsetD2D8Async_ptsz", "cuMemsetD8Async", "cuMemsetD8Async_ptsz", "cuInit"]


def served(names=("cuMemAlloc_v2", "cuMemcpyAsync", "cuMemsetD8Async", "cuInit")):
    return census.Served(
        census.served_functions(names, EXPORTS),
        census.newest_answers(ROWS),
        {TABLE_SERVED: "served", TABLE_DECLINED: "declined"},
    )


def tsv(*rows):
    return "".join(f"{count}\t{name}\n" for count, name in rows)


def unserved(*rows):
    return census.unserved_functions(census.parse_census(tsv(*rows)), served())


def test_a_base_name_the_driver_answers_with_a_served_symbol_counts_as_served():
    # cuGetProcAddress("cuMemAlloc") answers cuMemAlloc_v2 (the newest version's symbol), which is served
    assert unserved((120, "cuMemAlloc"), (3, "cuMemAlloc_v2")) == []


def test_an_unknown_function_is_reported_with_its_calls_summed_over_its_rows():
    got = unserved((4, "cuTensorMapEncodeTiled"), (2, "cuTensorMapEncodeTiled"), (9, "cuInit"), (1, "cuZeta"))
    assert got == [census.Unserved("cuTensorMapEncodeTiled", 6), census.Unserved("cuZeta", 1)]


def test_functions_obtained_but_never_called_and_other_libraries_names_do_not_count():
    assert unserved((0, "cuTensorMapEncodeTiled"), (7, "cublasCreate_v2"), (5, "cudaMalloc")) == []


def test_per_thread_variants_of_a_served_function_are_served_and_of_another_are_not():
    assert unserved((5, "cuMemcpyAsync"), (5, "cuMemcpyAsync_ptsz"), (5, "cuMemsetD8Async_ptsz")) == []
    got = unserved((3, "cuMemsetD2D8Async"), (2, "cuMemsetD2D8Async_ptsz"))
    assert got == [
        census.Unserved("cuMemsetD2D8Async", 3, ("cuMemsetD2D8Async", "cuMemsetD2D8Async_ptsz")),
        census.Unserved("cuMemsetD2D8Async_ptsz", 2),
    ]


def test_a_variant_the_driver_does_not_export_is_not_served():
    assert "cuInit_ptsz" not in served().functions and "cuInit_ptds" not in served().functions
    assert unserved((1, "cuInit_ptsz")) == [census.Unserved("cuInit_ptsz", 1)]


def test_a_base_name_is_served_only_when_every_flags_answer_is():
    # the per-thread answer (flag 2) of cuMemAlloc is served too; drop cuMemAlloc_v2 and neither is
    s = served(names=("cuMemAlloc",))
    got = census.unserved_functions(census.parse_census(tsv((8, "cuMemAlloc"))), s)
    assert got == [census.Unserved("cuMemAlloc", 8, ("cuMemAlloc_v2",))]


def test_export_tables_are_served_declined_or_unserved():
    usage = census.parse_census(
        tsv(
            (0, f"EXPORT_TABLE_{TABLE_SERVED}"),
            (0, f"EXPORT_TABLE_{TABLE_DECLINED}"),
            (0, f"EXPORT_TABLE_{TABLE_UNKNOWN}"),
        )
    )
    assert usage.tables == {TABLE_SERVED, TABLE_DECLINED, TABLE_UNKNOWN}
    assert census.unserved_tables(usage, served()) == [TABLE_UNKNOWN]


def test_a_line_that_is_not_a_census_row_is_an_error_naming_where():
    with pytest.raises(census.CensusError, match=r"torch:2: not a census line"):
        census.parse_census("3\tcuInit\ncuInit 3\n", "torch")


def test_the_repositorys_spec_serves_what_api_toml_and_export_tables_toml_name():
    s = census.load_served()
    assert "cuMemAlloc_v2" in s.functions and "cuMemcpyAsync_ptsz" in s.functions  # api.toml, and its variant
    assert "cuMemAlloc" not in s.functions and s.procaddr["cuMemAlloc"] == {"cuMemAlloc_v2"}
    assert s.tables[TABLE_SERVED] == "served" and s.tables[TABLE_DECLINED] == "declined"
    assert TABLE_UNKNOWN not in s.tables


def test_the_report_lists_each_programs_unserved_names_and_counts_distinct_ones_over_the_suite():
    a = census.Result("a", 0, tsv((5, "cuZeta"), (2, "cuInit"), (0, f"EXPORT_TABLE_{TABLE_UNKNOWN}")))
    b = census.Result("b", 0, tsv((7, "cuZeta"), (1, "cuEta")), "[census] cuGetExportTable 00 -> 1\n")
    lines, functions, tables = census.report([a, b], served())
    assert functions == {"cuZeta", "cuEta"} and tables == {TABLE_UNKNOWN}
    assert (
        census.summary([a, b], functions, tables) == "census programs=2 unserved_functions=2 unserved_export_tables=1"
    )
    text = "\n".join(lines)
    assert "a: 2 driver functions called, 1 export tables asked for; unserved: 1 functions, 1 export tables" in text
    assert [ln.split() for ln in lines if ln.startswith("  ") and "unserved" not in ln] == [
        ["5", "cuZeta"],
        ["-", "export", "table", TABLE_UNKNOWN],
        ["7", "cuZeta"],
        ["1", "cuEta"],
    ]


def test_a_failing_program_is_reported_as_failed_with_its_last_words():
    crashed = census.Result("torch-compile", 1, tsv((3, "cuZeta")), "warming up\nRuntimeError: no kernel image\n")
    silent = census.Result("cupy", -9, None, "")
    timed_out = census.Result("jax", None, None, "[census] cuGetExportTable 00 -> 0\n")
    lines, functions, _ = census.report([crashed, silent, timed_out], served())
    assert lines[0] == "torch-compile: FAILED natively (exit status 1: RuntimeError: no kernel image)"
    assert "cupy: FAILED natively (killed by signal 9)" in lines
    assert "jax: FAILED natively (ran past the time limit)" in lines
    assert functions == {"cuZeta"}  # what it used before failing still counts


def test_a_census_with_nothing_in_it_says_so():
    lines, _, _ = census.report([census.Result("vecadd", 0, "")], served())
    assert lines[-1] == "  nothing recorded: no process of it that used the GPU exited normally"


# ---- the command line, with a stand-in census ------------------------------------------------

FAKE_CENSUS_C = r"""
#include <stdio.h>
#include <stdlib.h>
/* stands in for the census: writes $FAKE_CENSUS_ROWS to $CENSUS_OUT at exit */
__attribute__((destructor)) static void dump(void)
{
	const char *path = getenv("CENSUS_OUT"), *rows = getenv("FAKE_CENSUS_ROWS");
	FILE *f = path && rows ? fopen(path, "w") : NULL;
	if (f) {
		fputs(rows, f);
		fclose(f);
	}
}
"""
FAKE_GEN_STUBS = 'open("stubs.S", "w").write(".section .note.GNU-stack,\\"\\",@progbits\\n")\n'


@pytest.fixture
def fake_census(tmp_path, monkeypatch):
    d = tmp_path / "census-tool"
    d.mkdir()
    (d / "census.c").write_text(FAKE_CENSUS_C)
    (d / "gen_stubs.py").write_text(FAKE_GEN_STUBS)
    monkeypatch.setenv("FAKE_CENSUS_ROWS", tsv((4, "cuInit"), (6, "cuZeta"), (0, f"EXPORT_TABLE_{TABLE_SERVED}")))
    return d


def run_cli(capsys, *args):
    status = census.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


def py(code):
    return f"{sys.executable} -c {code!r}"


def test_the_command_line_runs_each_program_under_the_census_and_reports_it(fake_census, tmp_path, capsys):
    out_dir = tmp_path / "out"
    ok = py("print('fine')")
    crash = py("import sys; print('CUDA error: no device', file=sys.stderr); sys.exit(3)")
    args = ["--census-dir", fake_census, "--out", out_dir, "--run", f"ok={ok}", "--run", f"crash={crash}"]
    status, out, err = run_cli(capsys, *args)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[-1] == "census programs=2 unserved_functions=1 unserved_export_tables=0"
    assert "crash: FAILED natively (exit status 3: CUDA error: no device)" in lines
    assert lines.count(f"  {6:>10}  cuZeta") == 2
    assert (out_dir / "ok.tsv").read_text().startswith("4\tcuInit\n") and (out_dir / "ok.log").read_text() == "fine\n"
    assert "census: ok: " in err

    # --strict: nonzero while anything is unserved; --from-dir reports the same files without running
    assert run_cli(capsys, *args, "--strict")[0] == 1
    status, again, _ = run_cli(capsys, "--from-dir", out_dir, "ok", "crash")
    assert status == 0 and again == out


def test_the_census_library_is_built_once_and_rebuilt_when_its_source_changes(fake_census, tmp_path):
    out_dir = tmp_path / "out"
    lib = census.build_census(fake_census, out_dir)
    built = lib.stat().st_mtime_ns
    assert census.build_census(fake_census, out_dir) == lib and lib.stat().st_mtime_ns == built
    os.utime(fake_census / "census.c", ns=(built + 10**9, built + 10**9))
    census.build_census(fake_census, out_dir)
    assert lib.stat().st_mtime_ns != built


def test_a_program_killed_before_writing_its_census_is_failed_not_its_last_runs_census(fake_census, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "gone.tsv").write_text(tsv((1, "cuInit")))  # an earlier run's
    kill = py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    status, out, _ = run_cli(capsys, "--census-dir", fake_census, "--out", out_dir, "--run", f"gone={kill}", "--strict")
    assert status == 1
    assert out.splitlines() == [
        "gone: FAILED natively (killed by signal 9)",
        "census programs=1 unserved_functions=0 unserved_export_tables=0",
    ]
    assert not (out_dir / "gone.tsv").exists() and (out_dir / "gone.exit").read_text() == "-9\n"


def test_a_link_left_in_place_of_a_programs_files_is_replaced_not_written_through(fake_census, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    for ext in (".tsv", ".log", ".exit"):
        (out_dir / f"p{ext}").symlink_to(victim)
    status, out, _ = run_cli(capsys, "--census-dir", fake_census, "--out", out_dir, "--run", f"p={py('print(1)')}")
    assert status == 0 and victim.read_text() == "keep\n"
    assert not any((out_dir / f"p{ext}").is_symlink() for ext in (".tsv", ".log", ".exit"))
    assert (out_dir / "p.log").read_text() == "1\n" and "cuZeta" in out


def test_a_program_linked_to_libcuda_counts_the_driver_functions_it_imports(fake_census, tmp_path, capsys, monkeypatch):
    """The census sees only dlsym and cuGetProcAddress: a C program linked to libcuda itself records
    nothing there, so what its ELF file imports counts (a served cuInit, an unserved cuZeta)."""
    monkeypatch.setenv("FAKE_CENSUS_ROWS", "")
    cc = os.environ.get("CC", "gcc")
    lib, prog = tmp_path / "libcuda.so.1", tmp_path / "linked"
    (tmp_path / "stub.c").write_text("int cuInit(unsigned f) { return 0; }\nint cuZeta(void) { return 0; }\n")
    (tmp_path / "prog.c").write_text(
        "int cuInit(unsigned); int cuZeta(void);\nint main(void) { return cuInit(0) + cuZeta(); }\n"
    )
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, tmp_path / "stub.c"], check=True)
    subprocess.run([cc, "-o", prog, tmp_path / "prog.c", lib, f"-Wl,-rpath,{tmp_path}"], check=True)
    out_dir = tmp_path / "out"
    args = [
        "--census-dir",
        fake_census,
        "--out",
        out_dir,
        "--run",
        f"linked={prog}",
        "--run",
        f"script={py('print(1)')}",
    ]
    status, out, err = run_cli(capsys, *args)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "linked: 0 driver functions called, 2 linked, 0 export tables asked for; unserved: 1 functions, 0 export tables"
    )
    assert lines[1:3] == [f"  {'calls':>10}  unserved", f"  {'linked':>10}  cuZeta"]
    assert lines[-1] == "census programs=2 unserved_functions=1 unserved_export_tables=0"
    assert "nothing recorded" in out.split("script:")[1]  # the script's census is empty and nothing is linked
    assert (out_dir / "linked.linked").read_text() == "cuInit\ncuZeta\n" and not (out_dir / "script.linked").exists()
    assert run_cli(capsys, "--from-dir", out_dir, "linked", "script")[1] == out


def test_each_process_of_a_program_writes_its_own_census_and_the_report_joins_them(fake_census, tmp_path, capsys):
    """A program whose work is in processes it starts (NCCL's ranks): the census writes its file as
    each process exits, so before, the parent, ending last, left only its own rows.  A forked child
    and a started one each count, and the per-process files are gone afterwards."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "env = dict(os.environ, FAKE_CENSUS_ROWS='5\\tcuEta\\n')\n"
        "subprocess.run([sys.executable, '-c', 'pass'], env=env, check=True)\n"
        "os.environ['FAKE_CENSUS_ROWS'] = '2\\tcuTheta\\n'\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "os.environ['FAKE_CENSUS_ROWS'] = '6\\tcuZeta\\n'\n"
    )
    prog = f"{sys.executable} {script}"
    out_dir = tmp_path / "out"
    status, out, err = run_cli(capsys, "--census-dir", fake_census, "--out", out_dir, "--run", f"ranks={prog}")
    assert status == 0 and "FAILED" not in out, out + err
    assert [ln.split() for ln in out.splitlines() if ln.startswith("  ") and "unserved" not in ln] == [
        ["6", "cuZeta"],
        ["5", "cuEta"],
        ["2", "cuTheta"],
    ]
    assert not (out_dir / "ranks.procs").exists() and (out_dir / "ranks.tsv").is_file()


def test_strict_is_zero_when_everything_used_is_served(tmp_path, capsys):
    (tmp_path / "clean.tsv").write_text(tsv((9, "cuMemAlloc"), (0, f"EXPORT_TABLE_{TABLE_DECLINED}")))
    status, out, _ = run_cli(capsys, "--from-dir", tmp_path, "--strict")
    assert status == 0 and out.splitlines()[-1] == "census programs=1 unserved_functions=0 unserved_export_tables=0"


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-program"], "no GPU test program no-such-program; the programs: drv_api-ptx-and-cubin"),
        (["--run", "bad name=true"], "--run 'bad name=true': give NAME=COMMAND"),
        (["--census-dir", "/nonexistent"], "/nonexistent/census.c not found: pass the census tool's directory"),
        (["--from-dir", "/nonexistent"], "/nonexistent: no census files"),
    ],
)
def test_what_keeps_the_census_from_running_is_one_line_and_exit_status_2(capsys, args, message):
    status, out, err = run_cli(capsys, *args)
    assert status == 2 and out == ""
    assert err.startswith(f"census: {message}") and err.count("\n") == 1, err


def test_the_census_covers_every_program_the_differential_tests_run_and_each_exists():
    assert SAME_OUTPUT.items() <= PROGRAMS.items()
    for name, args in PROGRAMS.items():
        scripts = [a for a in args if isinstance(a, Path) and a.suffix == ".py"]
        assert all(s.is_file() for s in scripts), name


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_program_that_needs_two_gpus_is_not_run_on_a_host_with_one_and_the_report_says_so(
    fake_census, tmp_path, capsys, monkeypatch, gpus
):
    monkeypatch.setattr(census, "PROGRAMS", {"solo": shlex.split(py("print(1)")), "pair": shlex.split(py("print(2)"))})
    monkeypatch.setattr(census, "TWO_GPUS", frozenset({"pair"}))
    monkeypatch.setattr(census, "gpu_count", lambda: gpus)
    out_dir = tmp_path / "out"
    status, out, _ = run_cli(capsys, "--census-dir", fake_census, "--out", out_dir)
    assert status == 0
    ran = sorted(p.stem for p in out_dir.glob("*.exit"))
    if gpus == 1:
        assert ran == ["solo"]
        assert "pair: not run (it needs two GPUs; this host has 1)" in out.splitlines()
        assert out.splitlines()[-1].startswith("census programs=1 ")
    else:
        assert ran == ["pair", "solo"] and "not run" not in out
