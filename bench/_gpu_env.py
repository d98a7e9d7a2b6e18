"""The GPU machine's interpreter: the wheels and data brought along in ``.gpu/``, put to use before any import.

A GPU machine may have its own Python (torch with CUDA, transformers, numpy, pyarrow, ...) but not the
project's other needs (pydantic, Great Expectations, mwparserfromhell) and no network. ``make gpu-bundle``
(:mod:`bench.gpu_bundle`, run where pip and the data are) fills the ignored folder ``.gpu/``:

- ``.gpu/wheels/``: the missing packages as wheels for the GPU machine's Python version;
- ``.gpu/data/``: a small data root laid out like ``../shared/data`` (a corpus sample, SST-2, a vocab).

:func:`activate` installs the wheels once (``pip install --no-index --target .gpu/site-<python>``), puts
that folder and the repository first on ``sys.path`` and ``PYTHONPATH`` (subprocesses: pytest, torchrun),
and points ``BERT_DATA_ROOT``/``BERT_SHARED_DATA`` at ``.gpu/data`` unless they are set. Without ``.gpu/``
it changes nothing, so the same commands run on a development machine's virtualenv.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / ".gpu"
WHEELS = BUNDLE / "wheels"
DATA = BUNDLE / "data"
PROVIDED = (
    "pydantic",
    "great_expectations",
    "mwparserfromhell",
)  # what the wheels are for (bench.gpu_bundle)


def _prepend(var: str, path: Path) -> None:
    parts = [p for p in os.environ.get(var, "").split(os.pathsep) if p]
    if str(path) not in parts:
        os.environ[var] = os.pathsep.join([str(path), *parts])


def site_dir() -> Path:
    """Where this interpreter's copy of the wheels is installed (one per Python version)."""
    return BUNDLE / f"site-py{sys.version_info.major}{sys.version_info.minor}"


def activate() -> dict[str, str]:
    """Make the bundle's wheels and data visible to this process and its children; return what was done.

    Raises:
        RuntimeError: pip could not install the wheels (e.g. they were downloaded for another Python
            version: run ``make gpu-bundle GPU_PYTHON_VERSION=<major.minor>`` again with this one).
    """
    done: dict[str, str] = {}
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    _prepend("PYTHONPATH", REPO)
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if wheels and not all(importlib.util.find_spec(m) for m in PROVIDED):  # a full virtualenv needs none
        site = site_dir()
        marker = site / ".installed"
        names = "\n".join(w.name for w in wheels)
        if not marker.is_file() or marker.read_text() != names:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                str(site),
                *map(str, wheels),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"installing {len(wheels)} wheels from {WHEELS} for Python {sys.version.split()[0]} failed "
                    f"(were they downloaded for another version? `make gpu-bundle GPU_PYTHON_VERSION="
                    f"{sys.version_info.major}.{sys.version_info.minor}`):\n{proc.stderr[-2000:]}"
                )
            marker.write_text(names)
        sys.path.insert(0, str(site))
        _prepend("PYTHONPATH", site)
        done["site"] = str(site)
    if DATA.is_dir():
        for var in ("BERT_DATA_ROOT", "BERT_SHARED_DATA"):
            if not os.environ.get(var):
                os.environ[var] = str(DATA)
                done[var] = str(DATA)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    return done
