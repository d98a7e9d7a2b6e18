"""CoNLL-2003 English NER loader: the original ``eng.*`` files (or their IOB2 copies), or a Hub parquet copy.

Canonical row (one per sentence)::

    {"id": str, "tokens": [str, ...], "tags": [str, ...]}   # tags in IOB2

The original files (``eng.train``, ``eng.testa`` = dev, ``eng.testb`` = test) have four space-separated
columns (token, POS, chunk, NER) in IOB1: a chunk starts with ``I-`` unless it directly follows a chunk of
the same type, which is the only place ``B-`` appears. The BERT paper and every current tool use IOB2
(``B-`` at every chunk start), so tags are converted (:func:`iob1_to_iob2`; idempotent on IOB2). Sentences
are separated by empty lines; ``-DOCSTART-`` lines separate documents and are not sentences. ``id`` is the
0-based sentence number within the split.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bert_core.tasks.base import TaskDataError, TaskRows, check_line_endings, excerpt, hub_source, hub_split
from bert_core.tasks.registry import CONLL_TAGS, TaskSpec


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Convert one sentence's IOB1 tags to IOB2 (``I-X`` that starts a chunk becomes ``B-X``).

    Example: ``["I-PER", "I-PER", "B-PER", "O", "I-LOC"]`` -> ``["B-PER", "I-PER", "B-PER", "O", "B-LOC"]``.
    """
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            out.append("B-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out


def load_conll_file(spec: TaskSpec, split: str, path: Path, limit: int | None = None) -> TaskRows:
    """Read a CoNLL-2003 file (4 columns, NER tag last; IOB1 or IOB2) into canonical IOB2 rows.

    Raises:
        TaskDataError: naming the file and line: a line that is not 4 space-separated columns, or a NER
            tag outside the CoNLL-2003 tag set.
    """
    valid = set(spec.labels) | {"B-" + t[2:] for t in spec.labels if t != "O"}
    rows: list[dict] = []
    tokens: list[str] = []
    tags: list[str] = []

    def flush() -> bool:
        nonlocal tokens, tags
        if tokens:
            rows.append({"id": str(len(rows)), "tokens": tokens, "tags": iob1_to_iob2(tags)})
            tokens, tags = [], []
        return limit is not None and len(rows) >= limit

    check_line_endings(path)
    # utf-8-sig: a byte-order mark would otherwise glue itself to the first token ("\ufeff-DOCSTART-").
    with path.open(encoding="utf-8-sig", newline="\n") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if flush():
                    break
                continue
            fields = line.split(" ")
            if len(fields) != 4:
                raise TaskDataError(
                    f"{path}:{lineno}: expected 4 space-separated columns (token POS chunk NER), got "
                    f"{len(fields)}: {excerpt(line)}"
                )
            if fields[0] == "-DOCSTART-":
                if flush():
                    break
                continue
            if fields[3] not in valid:
                raise TaskDataError(
                    f"{path}:{lineno}: unknown NER tag {excerpt(fields[3])}; valid tags: {sorted(valid)}"
                )
            tokens.append(fields[0])
            tags.append(fields[3])
        else:
            flush()
    return TaskRows(rows, task=spec.name, split=split, source=str(path))


def load_conll_hub(spec: TaskSpec, split: str, limit: int | None = None) -> TaskRows:
    """Load CoNLL-2003 from a Hub parquet copy (``ner_tags`` as ``ClassLabel`` ints or strings)."""
    hub_name = spec.hub_splits[split]
    ds = hub_split(spec.hub_path, spec.hub_config, hub_name, limit, spec.hub_revision)
    feature = ds.features["ner_tags"]
    inner = getattr(feature, "feature", None)
    names = list(getattr(inner, "names", None) or CONLL_TAGS)
    source = hub_source(spec.hub_path, spec.hub_config, hub_name, spec.hub_revision)
    rows = []
    for i, ex in enumerate(ds):
        tags = [t if isinstance(t, str) else names[t] for t in ex["ner_tags"]]
        bad = [t for t in tags if t not in spec.labels and t.replace("B-", "I-", 1) not in spec.labels]
        if bad:
            raise TaskDataError(f"{source}: sentence {i}: unknown NER tags {sorted(set(bad))}")
        rows.append({"id": str(ex.get("id", i)), "tokens": list(ex["tokens"]), "tags": iob1_to_iob2(tags)})
    return TaskRows(rows, task=spec.name, split=split, source=source)
