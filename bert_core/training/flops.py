"""Model FLOPs and model FLOPs utilisation (MFU) for BERT training.

The formula counts matrix multiplications only, the convention of Kaplan et al. (2020) and of
PaLM (Chowdhery et al. 2022, appendix B). A weight matrix with ``n`` parameters applied to one token
costs ``2 n`` FLOPs forward and ``4 n`` backward (gradients w.r.t. input and weight), so training
costs ``6 n`` FLOPs per token it is applied to. For one training step of a BERT encoder with ``L``
layers, hidden size ``H``, feed-forward size ``I``, vocabulary ``V`` and sequence length ``T``::

    FLOPs = 6 * N_layer * tokens                      # N_layer = L * (4 H^2 + 2 H I): QKV, output, FFN
          + 12 * L * H * T * tokens                   # attention: Q K^T and A V, 2 * 2 T^2 H per layer
          + 6 * (H^2 + H V) * masked_tokens           # MLM head, run only at the masked positions
          + 6 * (H^2 + 2 H) * sequences               # pooler + NSP classifier on [CLS]

``tokens`` is every position processed, padding included (the matmuls run on it). Embedding
look-ups, LayerNorm, softmax, GELU and biases are ignored (they are a few percent at most). The
MLM head term uses the masked positions only because our model runs the vocabulary projection
there only (Cramming's sparse prediction); the reference transformers model runs it at every
position, so it does more work than this formula credits. MFU is these FLOPs per second divided by
the dense peak of the devices used: ``MFU = FLOPs / step_time / (peak * world_size)``.
"""

from __future__ import annotations

import os

# Dense (no sparsity) tensor-core peaks in TFLOP/s from NVIDIA's datasheets:
# (bf16/fp16 with fp32 accumulate, tf32). Matched by substring of torch.cuda.get_device_name().
# Order matters: more specific names first.
_PEAK_TFLOPS: list[tuple[str, tuple[float, float]]] = [
    ("GH200", (989.4, 494.7)),
    ("H200", (989.4, 494.7)),
    ("H100 PCIE", (756.5, 378.0)),
    ("H100 NVL", (835.5, 417.5)),
    ("H100", (989.4, 494.7)),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", (989.4, 494.7)),
    ("B200", (2250.0, 1100.0)),
    ("A100", (312.0, 156.0)),
    ("A800", (312.0, 156.0)),
    ("L40S", (362.1, 183.0)),
    ("L4", (121.0, 60.0)),
    ("A10G", (70.0, 35.0)),
    ("A10", (125.0, 62.5)),
    ("RTX 4090", (165.2, 82.6)),
]


def peak_tflops(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak TFLOP/s of one device for ``dtype`` ("bf16", "fp16" or "fp32" = TF32 tensor cores).

    The environment variable ``BERT_PEAK_TFLOPS`` overrides the table (for devices it lacks).

    Returns:
        The peak, or None for a device that is not in the table (MFU is then not reported).
    """
    override = os.environ.get("BERT_PEAK_TFLOPS")
    if override:
        return float(override)
    name = device_name.upper()
    for key, (half, tf32) in _PEAK_TFLOPS:
        if key in name:
            return half if dtype in ("bf16", "fp16") else tf32
    return None


def bert_train_flops(
    *,
    num_layers: int,
    hidden_size: int,
    intermediate_size: int,
    vocab_size: int,
    seq_len: int,
    sequences: int,
    masked_tokens: int,
) -> float:
    """Training FLOPs (forward + backward) of one BERT pretraining batch, per the module formula.

    Args:
        num_layers: L.
        hidden_size: H.
        intermediate_size: I (4 H in the paper's sizes).
        vocab_size: V.
        seq_len: T, the padded length of the batch.
        sequences: number of sequences in the batch (B).
        masked_tokens: number of positions that carry an MLM label.

    Returns:
        FLOPs as a float.
    """
    h, t = hidden_size, seq_len
    tokens = sequences * t
    n_layer = num_layers * (4 * h * h + 2 * h * intermediate_size)
    dense = 6.0 * n_layer * tokens
    attention = 12.0 * num_layers * h * t * tokens
    mlm_head = 6.0 * (h * h + h * vocab_size) * masked_tokens
    nsp_head = 6.0 * (h * h + 2 * h) * sequences
    return dense + attention + mlm_head + nsp_head


def mfu(
    flops: float, seconds: float, peak_tflops_per_device: float | None, world_size: int = 1
) -> float | None:
    """Model FLOPs utilisation in [0, 1]: achieved FLOP/s over the peak of all devices used."""
    if peak_tflops_per_device is None or seconds <= 0:
        return None
    return flops / seconds / (peak_tflops_per_device * 1e12 * world_size)
