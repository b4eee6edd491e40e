"""The `vmgpu` command tree is what it was before the CLI was split by command group
(recorded at 38b3501, before the split, in data/cli_tree.json): every command, every
option and argument with its names, default, type and help, and every command's --help."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from vmgpu.cli.main import cli

RECORD = Path(__file__).parent / "data" / "cli_tree.json"


def _type(t: click.ParamType):
    """A parameter's type by what it accepts (its name, choices, path rules, range)."""
    info = t.to_info_dict()
    info.pop("param_type", None)
    return {"name": t.name, **{k: v for k, v in info.items() if k != "name"}}


def _param(p: click.Parameter) -> dict:
    return {
        "name": p.name,
        "kind": type(p).__name__,
        "opts": list(p.opts),
        "secondary_opts": list(p.secondary_opts),
        "type": _type(p.type),
        "default": repr(p.default),
        "required": p.required,
        "envvar": p.envvar,
        "help": getattr(p, "help", None),
        "is_flag": getattr(p, "is_flag", None),
        "show_default": getattr(p, "show_default", None),
        "metavar": p.metavar,
    }


def command_tree(cmd: click.Command = cli, path: tuple[str, ...] = ("vmgpu",)) -> dict:
    """{"vmgpu region create": {help, params}, ...} for every command under cmd."""
    out = {" ".join(path): {"help": cmd.help, "params": [_param(p) for p in cmd.params]}}
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            out.update(command_tree(sub, (*path, name)))
    return out


def help_pages() -> dict:
    """Every command's --help as a user sees it (80 columns)."""
    runner = CliRunner()
    pages = {}
    for path in command_tree():
        res = runner.invoke(cli, [*path.split()[1:], "--help"], prog_name="vmgpu", terminal_width=80)
        pages[path] = res.output
    return pages


def record() -> dict:
    return {"tree": command_tree(), "help": help_pages()}


def test_every_command_and_option_is_what_it_was_before_the_split():
    want = json.loads(RECORD.read_text())
    got = json.loads(json.dumps(command_tree()))
    assert sorted(got) == sorted(want["tree"]), "commands added or gone"
    for path, cmd in want["tree"].items():
        assert got[path] == cmd, path


def test_every_help_page_reads_as_it_did_before_the_split():
    want = json.loads(RECORD.read_text())["help"]
    got = help_pages()
    for path, page in want.items():
        assert got[path] == page, path


if __name__ == "__main__":  # re-record (only when a command is meant to change)
    RECORD.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
