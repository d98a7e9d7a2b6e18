"""A stand-in for the parts of TensorFlow 1.x that Google's ``create_pretraining_data.py`` touches.

Google's script (and its ``tokenization.py``) import ``tensorflow`` for plumbing only: ``tf.flags``,
``tf.app.run``, ``tf.logging``, ``tf.gfile`` (``GFile``, ``Glob``), ``tf.train.{Example, Features, Feature,
Int64List, FloatList}`` and ``tf.python_io.TFRecordWriter``. TensorFlow itself is not a dependency of this
project, so this module fakes exactly those names and runs the script unchanged on our Python:

    .venv/bin/python bench/tf1_shim.py /tmp/google_cpd.py --input_file=in.txt --output_file=out.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 ...

The writer produces the bytes TensorFlow would: each ``Example`` is serialized with the protobuf wire
format (packed varint / fixed32 lists, map entries) and framed as a TFRecord (length, CRC, data, CRC). The
two CRC fields are written as zeros (a pure-Python CRC32C would cost more than the rest of the writer), so
the file has the exact size of TensorFlow's but TensorFlow would reject it. Serialization is vectorised
with numpy so that it costs about what TensorFlow's C++ protobuf code costs, not more: the time measured
is the script's own.

On exit the runner prints one JSON line on stdout: records written, bytes written and the IsNext share
(``next_sentence_labels == 0``) of what was written.
"""

from __future__ import annotations

import argparse
import glob as _glob
import json
import logging
import runpy
import struct
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

_TOTALS = {"records": 0, "bytes": 0, "is_next": 0, "labelled": 0}


# --- protobuf wire format ------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varints(values: list[int]) -> bytes:
    """Concatenated varints of ``values`` (int64: negatives take ten bytes, as in protobuf)."""
    v = np.asarray(values, dtype=np.int64).view(np.uint64)
    if v.size == 0:
        return b""
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    out = np.empty(int(nbytes.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(nbytes)[:-1]))
    for k in range(int(nbytes.max())):
        sel = nbytes > k
        byte = ((v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= np.where(nbytes[sel] > k + 1, 0x80, 0).astype(np.uint8)
        out[starts[sel] + k] = byte
    return out.tobytes()


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# --- tf.train ------------------------------------------------------------------------------------------
class Int64List:
    def __init__(self, value: list[int] | None = None) -> None:
        self.value = list(value or [])

    def serialize(self) -> bytes:
        return _field(1, _varints(self.value)) if self.value else b""


class FloatList:
    def __init__(self, value: list[float] | None = None) -> None:
        self.value = list(value or [])

    def serialize(self) -> bytes:
        return _field(1, np.asarray(self.value, dtype="<f4").tobytes()) if self.value else b""


class Feature:
    def __init__(self, int64_list: Int64List | None = None, float_list: FloatList | None = None) -> None:
        self.int64_list = int64_list or Int64List()
        self.float_list = float_list or FloatList()

    def serialize(self) -> bytes:
        if self.int64_list.value:
            return _field(3, self.int64_list.serialize())
        return _field(2, self.float_list.serialize())


class Features:
    def __init__(self, feature: dict[str, Feature]) -> None:
        self.feature = feature

    def serialize(self) -> bytes:
        return b"".join(
            _field(1, _field(1, name.encode()) + _field(2, f.serialize())) for name, f in self.feature.items()
        )


class Example:
    def __init__(self, features: Features) -> None:
        self.features = features

    def SerializeToString(self) -> bytes:
        label = self.features.feature.get("next_sentence_labels")
        if label is not None and label.int64_list.value:
            _TOTALS["labelled"] += 1
            _TOTALS["is_next"] += int(label.int64_list.value[0] == 0)
        return _field(1, self.features.serialize())


# --- tf.python_io --------------------------------------------------------------------------------------
class TFRecordWriter:
    """TFRecord framing (uint64 length, CRC, data, CRC) with the CRCs written as zeros."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 (closed by close(), as TensorFlow's writer is)

    def write(self, record: bytes) -> None:
        self._fh.write(struct.pack("<QI", len(record), 0) + record + b"\0\0\0\0")
        _TOTALS["records"] += 1
        _TOTALS["bytes"] += len(record) + 16

    def close(self) -> None:
        self._fh.close()


# --- tf.gfile, tf.logging, tf.flags, tf.app ------------------------------------------------------------
def _gfile(path: str, mode: str = "r"):
    return open(path, mode, encoding=None if "b" in mode else "utf-8")


class _Flags:
    """``tf.flags``: DEFINE_* collect definitions; ``FLAGS`` is filled by ``tf.app.run``."""

    def __init__(self) -> None:
        self._defs: dict[str, tuple[type, Any, str]] = {}
        self._required: list[str] = []
        self.FLAGS = types.SimpleNamespace()

    def _define(self, kind: type, name: str, default: Any, help: str = "", **_: Any) -> None:
        self._defs[name] = (kind, default, help)
        setattr(self.FLAGS, name, default)

    def DEFINE_string(self, name, default, help="", **kw):
        self._define(str, name, default, help)

    def DEFINE_integer(self, name, default, help="", **kw):
        self._define(int, name, default, help)

    def DEFINE_float(self, name, default, help="", **kw):
        self._define(float, name, default, help)

    def DEFINE_bool(self, name, default, help="", **kw):
        self._define(bool, name, default, help)

    DEFINE_boolean = DEFINE_bool

    def mark_flag_as_required(self, name: str) -> None:
        self._required.append(name)

    def parse(self, argv: list[str]) -> list[str]:
        """absl-style ``--name=value`` / ``--name value`` / ``--[no]flag``; returns the remaining args."""
        ap = argparse.ArgumentParser(prog=argv[0] if argv else "script")
        for name, (kind, default, help_) in self._defs.items():
            if kind is bool:
                ap.add_argument(f"--{name}", type=_parse_bool, nargs="?", const=True, default=default)
                ap.add_argument(f"--no{name}", dest=name, action="store_false")
            else:
                ap.add_argument(f"--{name}", type=kind, default=default, help=help_)
        ns, rest = ap.parse_known_args(argv[1:])
        for name in self._required:
            if getattr(ns, name) is None:
                ap.error(f"flag --{name} must be given")
        for name, value in vars(ns).items():
            setattr(self.FLAGS, name, value)
        return argv[:1] + rest


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "t", "yes"):
        return True
    if text.lower() in ("0", "false", "f", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _run(main=None, argv: list[str] | None = None) -> None:
    rest = FLAGS_MODULE.parse(list(sys.argv if argv is None else argv))
    (main or sys.modules["__main__"].main)(rest)


def make_module() -> types.ModuleType:
    """The fake ``tensorflow`` module."""
    tf = types.ModuleType("tensorflow")
    tf.__version__ = "1.15.0-shim"
    tf.flags = FLAGS_MODULE
    tf.app = types.SimpleNamespace(run=_run, flags=FLAGS_MODULE)
    log = logging.getLogger("tensorflow")
    tf.logging = types.SimpleNamespace(
        info=log.info,
        warning=log.warning,
        warn=log.warning,
        error=log.error,
        debug=log.debug,
        set_verbosity=log.setLevel,
        INFO=logging.INFO,
        WARN=logging.WARNING,
        ERROR=logging.ERROR,
        DEBUG=logging.DEBUG,
    )
    tf.gfile = types.SimpleNamespace(GFile=_gfile, Open=_gfile, Glob=lambda p: sorted(_glob.glob(p)))
    tf.train = types.SimpleNamespace(
        Example=Example, Features=Features, Feature=Feature, Int64List=Int64List, FloatList=FloatList
    )
    tf.python_io = types.SimpleNamespace(TFRecordWriter=TFRecordWriter)
    return tf


FLAGS_MODULE = _Flags()


def run_script(script: Path, args: list[str]) -> dict[str, Any]:
    """Run ``script`` as ``__main__`` with ``args`` against the fake TensorFlow; return the writer totals."""
    sys.modules["tensorflow"] = make_module()
    sys.path.insert(0, str(script.parent))  # its `import tokenization`
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")
    share = _TOTALS["is_next"] / _TOTALS["labelled"] if _TOTALS["labelled"] else float("nan")
    return {"instances": _TOTALS["records"], "bytes": _TOTALS["bytes"], "is_next_share": share}


def main() -> None:
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_file():
        raise SystemExit(
            "usage: tf1_shim.py PATH/TO/create_pretraining_data.py [--flag=value ...] "
            "(tokenization.py must sit beside it)"
        )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
    totals = run_script(Path(sys.argv[1]), sys.argv[2:])
    print(json.dumps(totals), flush=True)


if __name__ == "__main__":
    main()
