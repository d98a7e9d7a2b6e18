"""Write and check requirements/lock.txt, the pinned versions `make` installs with.

The lock is a pip constraints file: one `name==version` per line for every package the project and its
extras pull in, except torch and its CUDA packages (the Makefile's TORCH_SPEC picks the torch build). Its
header records a hash of pyproject.toml's dependency lists, so a changed bound is detected
(tests/test_lock.py) until `make lock` is run again.

    python requirements/lock.py write FREEZE_FILE   # `make lock`: FREEZE_FILE is a `pip freeze` output
    python requirements/lock.py hash                # the hash of the current pyproject.toml

Standard library only: it runs in the throwaway venv of `make lock` and in the test suite.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements" / "lock.txt"
HASH_KEY = "pyproject-sha256"

# Not pinned here: torch comes from TORCH_SPEC (CPU or CUDA build); these come with a CUDA torch.
_UNPINNED = re.compile(r"^(torch|triton|pytorch-triton|nvidia-.*|cuda-.*)$")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def normalize(name: str) -> str:
    """PEP 503 name normalisation (what `packaging.utils.canonicalize_name` does)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_hash(path: Path = PYPROJECT) -> str:
    """sha256 of the project's dependency lists (dependencies + every extra), comments and layout aside."""
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    lists = {
        "dependencies": [d.strip() for d in project.get("dependencies", [])],
        "optional-dependencies": {
            extra: [d.strip() for d in deps]
            for extra, deps in sorted(project.get("optional-dependencies", {}).items())
        },
    }
    blob = json.dumps(lists, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_header_hash(path: Path = LOCK) -> str | None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"# {HASH_KEY}:"):
            return line.split(":", 1)[1].strip()
    return None


def read_pins(path: Path = LOCK) -> list[tuple[str, str]]:
    """The (name, version) pins in file order; raises on any line that is not a plain `name==version`."""
    pins = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"{path.name}:{n}: not a `name==version` pin: {raw!r}")
        pins.append((match.group(1), match.group(2)))
    return pins


def pins_from_freeze(text: str) -> list[str]:
    """The lock lines from a `pip freeze --exclude-editable` output, torch and CUDA packages left out."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise SystemExit(f"`pip freeze` gave a line that is not a `name==version` pin: {raw!r}")
        if not _UNPINNED.match(normalize(match.group(1))):
            lines.append(line)
    return sorted(lines, key=lambda s: normalize(s.split("==")[0]))


def write(freeze_file: Path, torch_spec: str) -> None:
    pins = pins_from_freeze(freeze_file.read_text(encoding="utf-8"))
    header = [
        "# The exact versions the test suites pass with, as pip constraints: `make` installs",
        '# `pip install -c requirements/lock.txt -e ".[dev]"` (opt out: `make LOCK=`).',
        "# Written by `make lock` (requirements/lock.py) from `pip freeze`; do not edit by hand.",
        f"# Resolved on {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}, with {torch_spec} installed first; torch and its",
        "# CUDA packages (nvidia-*, triton) are not pinned here: the Makefile's TORCH_SPEC picks the build.",
        f"# {HASH_KEY}: {pyproject_hash()}",
    ]
    LOCK.write_text("\n".join([*header, *pins]) + "\n", encoding="utf-8")
    print(f"wrote {LOCK.relative_to(ROOT)}: {len(pins)} pins")


def main(argv: list[str]) -> None:
    if argv[:1] == ["hash"] and len(argv) == 1:
        print(pyproject_hash())
    elif argv[:1] == ["write"] and len(argv) in (2, 3):
        write(Path(argv[1]), argv[2] if len(argv) == 3 else "torch")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
