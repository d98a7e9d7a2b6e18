"""Compressed input files: which compressions are read, what a damaged file raises, and a file whose bytes
are not what its name says.

A file is decompressed by the compression its name ends in (fsspec's inference from the suffix). A file whose
bytes start as a compressed format or an archive does but whose name does not say so (``corpus.txt`` that is
gzip, ``books.jsonl.gz`` that is zstd, a ``.tar.gz``) is refused by :func:`check_content`: read as text, its
bytes would enter the corpus as replacement characters, or one archive member as a document.
"""

from __future__ import annotations

import lzma
import re
import zlib
from pathlib import Path

import fsspec

try:  # Python 3.14's standard library; the backport before (a project dependency)
    from compression.zstd import ZstdError
except ImportError:  # pragma: no cover - depends on the Python version
    from backports.zstd import ZstdError

#: The compressions read, by fsspec's names for them (``infer_compression``), and their suffixes; a folder
#: source reads its kind's files with each of these suffixes too.
SUFFIX = {"gzip": ".gz", "bz2": ".bz2", "xz": ".xz", "zstd": ".zst", "lzma": ".lzma"}
#: What reading a corrupt or truncated compressed file raises.
ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError, ZstdError)

#: A bz2 stream's header and its first block's magic (a stream with text in it).
BZ2_STREAM = rb"BZh[1-9]1AY&SY"
#: The first bytes of the compressions read that have a signature, and of the formats that are not read.
_MAGIC = {
    "gzip": re.compile(rb"\x1f\x8b"),
    "bz2": re.compile(BZ2_STREAM + rb"|BZh[1-9]\x17rE8P\x90"),  # or an empty stream's end-of-stream magic
    "xz": re.compile(rb"\xfd7zXZ\x00"),
    "zstd": re.compile(rb"\x28\xb5\x2f\xfd"),
}
_ARCHIVES = {
    "a zip archive": re.compile(rb"PK\x03\x04"),
    "a 7-Zip archive": re.compile(rb"7z\xbc\xaf\x27\x1c"),
    "an LZ4 file": re.compile(rb"\x04\x22\x4d\x18"),
    "a tar archive": re.compile(rb"(?s).{257}ustar(?:\x0000|  \x00)"),
}


def check_content(path: Path) -> None:
    """Refuse ``path`` if its bytes are compressed otherwise than its name says (before and after the
    decompression its name gives), or are an archive. A file that cannot be read is left to its reader,
    which names the fault.

    Raises:
        ValueError: what the bytes are and what to do (name the file for its compression, or unpack it).
    """
    by_name = fsspec.utils.infer_compression(path.name)
    if by_name not in (None, *SUFFIX):
        raise ValueError(f"{path}: is a {by_name} archive; unpack it and give the files inside as the source")
    # the bytes as stored, which the name's compression must start; then, decompressed, which none may
    for decompress, expected in [(None, by_name)] + ([(by_name, None)] if by_name else []):
        try:
            raw = decompress is None  # the plain open: a third of fsspec's cost, for a folder of many files
            with path.open("rb") if raw else fsspec.open(path, "rb", compression=decompress) as fh:
                head = fh.read(512)
        except ERRORS:
            return
        for what, magic in _ARCHIVES.items():
            if magic.match(head):
                raise ValueError(f"{path}: is {what}; unpack it and give the files inside as the source")
        found = next((name for name, magic in _MAGIC.items() if magic.match(head)), expected)
        if found == expected:
            continue
        if by_name is not None and expected is None:
            raise ValueError(
                f"{path}: once decompressed ({by_name}), its bytes are {found}-compressed again; decompress "
                "it to one compression (or none) and give that file"
            )
        stem = path.name.removesuffix(SUFFIX.get(by_name or "", ""))
        said = f"its name says {by_name}" if by_name else "its name says it is not compressed"
        raise ValueError(
            f"{path}: its bytes are {found}-compressed ({said}); name it for what it is (here: "
            f"{stem}{SUFFIX[found]}) so that it is decompressed"
        )
