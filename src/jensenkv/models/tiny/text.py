"""Text side of the tiny model: a word-level tokenizer over the prompt grammar and a learned embedding encoder.

The empty prompt ("") tokenizes to all padding and encodes to all zeros (``padding_idx``), which is the
unconditional branch of classifier-free guidance -- the same convention as Wan, whose pipeline zeroes the
T5 states past the prompt length.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from jensenkv.models.tiny.data import BACKGROUNDS, COLOURS, DIRECTIONS, SHAPES

PAD = "<pad>"


def grammar_vocabulary() -> list[str]:
    """Every word the prompt grammar can produce, pad first (id 0)."""
    words = ["a", "moving", "on", "background", *COLOURS, *SHAPES, *DIRECTIONS, *BACKGROUNDS]
    return [PAD, *dict.fromkeys(words)]


@dataclass(frozen=True)
class TextConfig:
    vocab: tuple[str, ...] = tuple(grammar_vocabulary())
    max_length: int = 12
    text_dim: int = 64

    def to_dict(self) -> dict:
        d = asdict(self)
        d["vocab"] = list(self.vocab)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TextConfig:
        return cls(vocab=tuple(d["vocab"]), max_length=int(d["max_length"]), text_dim=int(d["text_dim"]))


class WordTokenizer:
    """Lower-cases, splits on whitespace, maps words to ids and right-pads to ``max_length`` with id 0."""

    pad_id = 0

    def __init__(self, vocab: tuple[str, ...] | list[str], max_length: int):
        if not vocab or vocab[0] != PAD:
            raise ValueError(f"vocab[0]={vocab[0] if vocab else None!r} is not allowed: it must be {PAD!r}")
        self.vocab = list(vocab)
        self.max_length = max_length
        self._ids = {w: i for i, w in enumerate(self.vocab)}

    def encode(self, prompt: str) -> list[int]:
        words = prompt.lower().split()
        unknown = [w for w in words if w not in self._ids or w == PAD]
        if unknown:
            raise ValueError(f"prompt={prompt!r} has words outside the vocabulary {unknown}; "
                             f"allowed words: {self.vocab[1:]}")
        if len(words) > self.max_length:
            raise ValueError(f"prompt={prompt!r} has {len(words)} words; max_length is {self.max_length}")
        return [self._ids[w] for w in words] + [self.pad_id] * (self.max_length - len(words))

    def __call__(self, prompts: str | list[str]) -> torch.Tensor:
        """Token ids, (B, L) int64."""
        if isinstance(prompts, str):
            prompts = [prompts]
        return torch.tensor([self.encode(p) for p in prompts], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return " ".join(self.vocab[int(i)] for i in ids if int(i) != self.pad_id)


class TextEncoder(nn.Module):
    """(B, L) token ids -> (B, L, text_dim) embeddings; pad positions are exactly zero."""

    def __init__(self, vocab_size: int, text_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, text_dim, padding_idx=WordTokenizer.pad_id)
        nn.init.normal_(self.embedding.weight, std=1.0)
        with torch.no_grad():
            self.embedding.weight[WordTokenizer.pad_id].zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)  # (B, L, text_dim)


def build_text(cfg: TextConfig) -> tuple[WordTokenizer, TextEncoder]:
    return WordTokenizer(cfg.vocab, cfg.max_length), TextEncoder(len(cfg.vocab), cfg.text_dim)
