"""The ``corpus`` stage: raw text sources -> cleaned, sentence-segmented documents in Parquet shards.

Public API::

    from bert_core.corpus import CorpusParams, build_corpus, iter_documents
    stats = build_corpus(params, Path("data/corpus"), data_root=None, workers=2)
"""

from bert_core.corpus.build import EmptyCorpusError, build_corpus
from bert_core.corpus.params import CapParams, CleanParams, CorpusParams, HeldoutParams, SourceSpec
from bert_core.corpus.shards import SCHEMA, iter_documents, read_manifest, shard_paths
from bert_core.corpus.stats import CorpusStats
from bert_core.corpus.units import CorpusError, SourceNotFoundError

__all__ = [
    "SCHEMA",
    "CapParams",
    "CleanParams",
    "CorpusError",
    "CorpusParams",
    "CorpusStats",
    "EmptyCorpusError",
    "HeldoutParams",
    "SourceNotFoundError",
    "SourceSpec",
    "build_corpus",
    "iter_documents",
    "read_manifest",
    "shard_paths",
]
