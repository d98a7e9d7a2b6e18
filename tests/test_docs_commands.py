"""The commands the README and docs/ show work as written, as far as they can be checked without running them:
each ``make`` word is a target of the Makefile, each ``python -m module`` / ``python script.py`` exists, and
each ``--flag`` it is given is one its ``--help`` names (a subcommand's help where the first argument is one).

Commands are read from ``bash``/``sh`` fenced blocks and indented code blocks (untagged fences hold
diagrams and file trees), and from inline code in the prose; a line ending in ``\\`` continues on the
next; ``&&``, ``;`` and ``|`` separate commands (``list|show`` alternatives too); leading ``VAR=value``
assignments and ``/usr/bin/time -v`` are stepped over, ``[...]`` marks an optional part, and a command
with a ``<placeholder>`` in its module is left out.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from bert_core.constants import REPO_ROOT

DOCS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
PYTHONS = ("python", "python3", ".venv/bin/python")
_INLINE = re.compile(r"`((?:make|python3?|\.venv/bin/python) [^`]+)`")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each command line of a Markdown text, continuations joined, and of each
    inline code span in its prose that starts with ``make`` or ``python``."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None  # the open fence's language ("" untagged), None outside a fence
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            continue
        if fence in ("bash", "sh") or (fence is None and line.startswith("    ") and stripped):
            lines.append((number, stripped))
        elif fence is None:
            lines += [(number, span) for span in _INLINE.findall(line)]
    joined: list[tuple[int, str]] = []
    for number, line in lines:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line)
        else:
            joined.append((number, line))
    return joined


def commands(line: str) -> list[list[str]]:
    """The words of each command on a line, comments, assignments and ``time`` stepped over."""
    out = []
    for part in re.split(r"&&|;|\||&", line.split(" #")[0]):
        try:
            words = shlex.split(part)
        except ValueError:  # prose in an indented block, a quote spanning lines
            continue
        while words and (_ASSIGNMENT.match(words[0]) or words[0] in ("/usr/bin/time", "-v")):
            words.pop(0)
        words = [w.strip("[]") for w in words if w.strip("[]")]  # ``[--flag VALUE]``: an optional part
        if words and not any(c in " ".join(words[:3]) for c in "<…"):  # ``python -m flows.<stage>``
            out.append(words)
    return out


def documented() -> list[tuple[str, list[str]]]:
    """Every ``make`` and ``python`` command of the docs, with the place it is written."""
    found = []
    for doc in DOCS:
        for number, line in code_lines(doc.read_text(encoding="utf-8")):
            for words in commands(line):
                if words[0] == "make" or words[0] in PYTHONS:
                    found.append((f"{doc.relative_to(REPO_ROOT)}:{number}", words))
    return found


def make_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    rules = re.findall(r"^([A-Za-z0-9_.%/ -]+?)\s*:(?!=)", text, re.MULTILINE)
    return {target for rule in rules for target in rule.split()}


#: Run in one subprocess: each argv's ``--help`` text, from the module or script run as ``__main__`` (one
#: interpreter, so torch and the rest are imported once).
_HELP = r"""
import contextlib, io, json, runpy, sys
out = {}
for argv in json.load(sys.stdin):
    text = io.StringIO()
    sys.argv = [argv[0], *argv[1:], "--help"]
    try:
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            if argv[0].endswith(".py"):
                runpy.run_path(argv[0], run_name="__main__")
            else:
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    except Exception as err:
        text.write(f"\nFAILED: {type(err).__name__}: {err}")
    out[" ".join(argv)] = text.getvalue()
print(json.dumps(out))
"""


def python_target(words: list[str]) -> tuple[str, list[str]] | None:
    """(module or script, its arguments) of a ``python`` command; None for ``-c`` and the like."""
    if len(words) > 2 and words[1] == "-m":
        return words[2], words[3:]
    if len(words) > 1 and words[1].endswith(".py"):
        return words[1], words[2:]
    return None


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    wanted: set[tuple[str, ...]] = set()
    for _, words in documented():
        if (target := python_target(words)) is None:
            continue
        module, args = target
        wanted.add((module,))
        if args and not args[0].startswith("-"):  # perhaps a subcommand
            wanted.add((module, args[0]))
    proc = subprocess.run(
        [sys.executable, "-c", _HELP],
        input=json.dumps(sorted(wanted)),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_docs_show_commands_to_check():
    found = documented()
    assert any(words[:2] == ["make", "pipeline"] for _, words in found)
    assert any(python_target(words) for _, words in found)


def test_every_documented_make_word_is_a_target():
    targets = make_targets()
    wrong = [
        f"{where}: make {word}"
        for where, words in documented()
        if words[0] == "make"
        for word in words[1:]
        if not _ASSIGNMENT.match(word) and not word.startswith(("-", "[")) and word not in targets
    ]
    assert not wrong, "\n".join(wrong)


def test_every_documented_python_command_exists_and_takes_its_flags(help_texts):
    wrong = []
    for where, words in documented():
        if (target := python_target(words)) is None:
            continue
        module, args = target
        text = help_texts[module]
        if "FAILED:" in text or "usage:" not in text:
            wrong.append(f"{where}: {module} --help gives no usage: {text[-300:]}")
            continue
        if args and not args[0].startswith("-"):
            text += help_texts.get(f"{module} {args[0]}", "")
        for flag in (a.split("=")[0] for a in args if a.startswith("--")):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                wrong.append(f"{where}: {module} takes no {flag}")
    assert not wrong, "\n".join(wrong)


def test_a_wrong_flag_or_target_would_be_found(help_texts):
    """The checks above can fail: a flag the help does not name, and a word that is no target."""
    assert "--no-such-flag" not in help_texts["flows.predict"]
    assert "no-such-target" not in make_targets()
    assert {"pipeline", "test", "test-faults", "gpu-run"} <= make_targets()
