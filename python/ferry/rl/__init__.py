"""RL weight transfer: trainer ranks write new weights straight into the live weight
memory of inference ranks with one-sided writes, on a static schedule (docs/RL.md).

    from ferry import rl
    sender = rl.WeightSender(engine, exchange, rank, blocks, ...)   # trainer rank
    receiver = rl.WeightReceiver(engine, exchange, rank, tensors, recipes)  # inference

Submodules: ``meta`` (what both sides publish), ``model`` (per-model mappings),
``quant`` (fp8 e4m3 128x128 block quantisation; ``quant_triton``: the same in one CUDA
kernel), ``schedule`` (the static schedule), ``exchange`` (rendezvous: torch.distributed
or plain callables), ``backends`` (staging memory and device work: NumPy, torch),
``pipeline`` (the per-step pipeline, trainer side; ``steps``: a step's bookkeeping and
stats; ``mapped``: writes as stores where the inference memory maps into the trainer),
``receiver`` (the inference side), ``fsdp`` (blocks and shards of an FSDP2 module),
``plan`` (``python -m ferry.rl.plan``: the cluster-scale planner).
"""

from __future__ import annotations

from . import meta, model, quant, schedule  # noqa: F401

__all__ = ["meta", "model", "quant", "schedule"]
