"""The generation layer: how a video is sampled chunk by chunk over a model adapter and its KV cache.

``config``: ``GenerationConfig``, the loop's node of the config tree (chunks, steps, shift, CFG, sampler,
kv_range, window). ``loop``: the chunk-wise loop (``generate_video`` / ``generate_videos``), the adapter
contract it drives (``ChunkwiseModel``) and the base class that gives an adapter its defaults
(``ChunkwiseAdapterBase``). ``teacher_forced``: each chunk read with the BF16 run's own history on the same
contract. Nothing here imports a model family (docs/ARCHITECTURE.md).
"""
