"""Stack per-video stored tensors along the batch axis, so a batch of videos is stored as each video alone,
and take one video's stored tensor back out of a stack (``video_of``).

A cache that holds a batch quantizes every video with its own quantizer (its own statistics, dither draws,
k-means start and warm state: ``jensenkv.cache``), then stacks the stored forms here into one tensor of
batch B that the attention paths read as any other. Nothing is re-quantized: codes, steps, zeros,
centroids and means are concatenated as stored, so the stacked tensor dequantizes, sample by sample, to
exactly what each video's own tensor does, and its bytes are the sum of theirs.
"""
from __future__ import annotations

import dataclasses

import torch

from jensenkv.quant.packing import pack_codes, packed_nbytes
from jensenkv.quant.qvg import QVGTensor
from jensenkv.quant.rtn import GroupLayout, RTNTensor
from jensenkv.quant.smoothing import ChannelMeanTensor
from jensenkv.quant.tensors import FullPrecisionTensor, QuantizedTensor


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if parts[0] is None else torch.cat(parts, dim=0)


def _packed(parts: list[RTNTensor]) -> torch.Tensor:
    """Concatenated packed codes: the byte streams as they are when each video's ends on a whole unit,
    else repacked from the codes (INT3 with an odd element count, say)."""
    first = parts[0]
    numel = first.shape[0] * first.shape[1] * first.shape[2] * first.shape[3]
    if packed_nbytes(numel, first.bits) * 8 == numel * first.bits:
        return torch.cat([p.packed for p in parts])
    return pack_codes(torch.cat([p.codes() for p in parts]), first.bits, check=False)


def _stack_rtn(parts: list[RTNTensor]) -> RTNTensor:
    first = parts[0]
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    layout = GroupLayout(first.layout.granularity, first.layout.group_size, shape)
    dither = None
    if first.dither is not None:  # every video's quantizer made the same numbered draw
        dither = dataclasses.replace(first.dither, samples=sum(p.dither.samples for p in parts))
    return RTNTensor(_packed(parts), _cat([p.step for p in parts]), _cat([p.zero for p in parts]), first.bits,
                     layout, first.rotation, first.zero_point, dither)


def stack_samples(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Per-video stored tensors, each (1, H, S, D) (or (b_i, H, S, D)), as one (sum b_i, H, S, D) tensor."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    kind = type(first)
    if any(type(p) is not kind or tuple(p.shape[1:]) != tuple(first.shape[1:]) for p in parts):
        raise ValueError("stack_samples needs stored tensors of one kind and one (H, S, D); got "
                         f"{[(type(p).__name__, tuple(p.shape)) for p in parts]}")
    if kind is FullPrecisionTensor:
        stacked = FullPrecisionTensor(torch.cat([p.data for p in parts]), first.data.dtype)
    elif kind is RTNTensor:
        stacked = _stack_rtn(parts)
    elif kind is ChannelMeanTensor:
        stacked = ChannelMeanTensor(stack_samples([p.inner for p in parts]), torch.cat([p.mean for p in parts]))
    elif kind is QVGTensor:
        stages = range(len(first.centroids))
        stacked = QVGTensor([torch.cat([p.centroids[i] for p in parts]) for i in stages],
                            [torch.cat([p.assignments[i] for p in parts]) for i in stages],
                            _stack_rtn([p.residual for p in parts]), None, first.spans)
    else:
        raise ValueError(f"stack_samples does not know how to stack {kind.__name__}")
    stacked.rotation = first.rotation  # every video's quantizer draws the same rotation from its seed
    return stacked


def _video_rtn(stored: RTNTensor, b: int) -> RTNTensor:
    batch = stored.shape[0]
    shape = (1, *stored.shape[1:])
    if stored.packed.ndim == 4:  # held in a cache's store: video b's rows are views of its buffers, no copy
        own = slice(b, b + 1)
        video = RTNTensor(stored.packed[own], stored.step[own], None if stored.zero is None else stored.zero[own],
                          stored.bits, GroupLayout(stored.layout.granularity, stored.layout.group_size, shape),
                          stored.rotation, stored.zero_point, stored.dither)
        video.stat_rows = stored.stat_rows
        return video
    numel = shape[1] * shape[2] * shape[3]
    if packed_nbytes(numel, stored.bits) * 8 == numel * stored.bits:
        n = packed_nbytes(numel, stored.bits)
        packed = stored.packed[b * n:(b + 1) * n].clone()
    else:
        packed = pack_codes(stored.codes()[b:b + 1], stored.bits, check=False)
    dither = None
    if stored.dither is not None:
        if stored.dither.samples != batch:
            raise ValueError("video_of needs a stacked tensor: this one's dither was drawn for the whole batch")
        dither = dataclasses.replace(stored.dither, samples=1)
    zero = None if stored.zero is None else stored.zero[b:b + 1].clone()
    return RTNTensor(packed, stored.step[b:b + 1].clone(), zero, stored.bits,
                     GroupLayout(stored.layout.granularity, stored.layout.group_size, shape), stored.rotation,
                     stored.zero_point, dither)


def video_of(stored: QuantizedTensor, b: int) -> QuantizedTensor:
    """Video b's (1, H, S, D) stored tensor out of a stack (``stack_samples``): exactly the tensor it had alone."""
    if stored.shape[0] == 1:
        return stored
    if isinstance(stored, FullPrecisionTensor):
        video = FullPrecisionTensor.view_of(stored.data[b:b + 1])  # (1, H, S, D): stored tensors are never written
    elif isinstance(stored, RTNTensor):
        video = _video_rtn(stored, b)
    elif isinstance(stored, ChannelMeanTensor):
        video = ChannelMeanTensor(video_of(stored.inner, b), stored.mean[b:b + 1].clone())
    elif isinstance(stored, QVGTensor):
        video = QVGTensor([c[b:b + 1].clone() for c in stored.centroids], [a[b:b + 1].clone() for a in stored.assignments],
                          _video_rtn(stored.residual, b), None, stored.spans)
    else:
        raise ValueError(f"video_of does not know how to split {type(stored).__name__}")
    video.rotation = stored.rotation
    return video
