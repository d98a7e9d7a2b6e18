"""Fill-mask, what a pretrained model (``bert-pretrained``) answers when served: the MLM head's top-k
tokens for every ``[MASK]`` of a text. It has the serving interface of the task kinds
(:meth:`bert_core.kinds.base.TaskKind.serve`)."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

import numpy as np

from bert_core.kinds.base import ServingInputError, softmax

#: Most candidates a request may ask for (``params={"top_k": k}``).
MAX_TOP_K = 100


class FillMask:
    """``fill_mask``: ``text`` with one or more ``[MASK]`` -> per mask, the top-k tokens and their scores."""

    name = "fill_mask"

    @property
    def model_class(self) -> type:
        from bert_core.model import BertForMaskedLM

        return BertForMaskedLM

    def serving_inputs(self, spec: Any) -> list[tuple[str, str, bool]]:
        return [("text", "string", True)]

    def serving_outputs(self, spec: Any) -> list[tuple[str, str, bool]]:
        return [("tokens", "string[][]", True), ("scores", "double[][]", True)]

    def serving_example(self, spec: Any) -> list[dict[str, Any]]:
        return [{"text": "The capital of France is [MASK]."}]

    def serve(
        self,
        spec: Any,
        records: Sequence[dict[str, Any]],
        tokenizer: Any,
        run: Any,
        settings: Any,
        options: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """``tokens`` / ``scores``: one list per ``[MASK]`` (in text order) of the ``top_k`` best tokens."""
        top_k = options.get("top_k")
        top_k = 5 if top_k is None else top_k
        if isinstance(top_k, bool) or not isinstance(top_k, Integral) or not 1 <= top_k <= MAX_TOP_K:
            raise ServingInputError(f"param 'top_k' must be an integer in 1..{MAX_TOP_K}, got {top_k!r}")
        mask_id = tokenizer.mask_token_id
        enc = tokenizer(
            [r["text"] for r in records],
            truncation=True,
            max_length=settings.max_seq_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=True,
        )
        features = []
        for i, ids in enumerate(enc["input_ids"]):
            if mask_id not in ids:
                raise ServingInputError(
                    f"record {i}: field 'text' has no {tokenizer.mask_token} within its first "
                    f"{settings.max_seq_length} tokens; put {tokenizer.mask_token} where a word should be filled"
                )
            features.append({"input_ids": ids, "token_type_ids": enc["token_type_ids"][i]})
        out = []
        for feature, logits in zip(features, run(features)):
            positions = [p for p, t in enumerate(feature["input_ids"]) if t == mask_id]
            tokens, scores = [], []
            for p in positions:
                probs = softmax(logits[p])
                best = np.argsort(-probs, kind="stable")[: int(top_k)]
                tokens.append([tokenizer.convert_ids_to_tokens(int(t)) for t in best])
                scores.append([float(probs[t]) for t in best])
            out.append({"tokens": tokens, "scores": scores})
        return out
