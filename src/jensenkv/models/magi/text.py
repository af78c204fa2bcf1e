"""MAGI-1's caption encoders: T5-v1.1-XXL through ``transformers``, and a tiny seeded one for tests.

Both return, per chunk, the valid caption tokens (L_j, caption_channels) the cross-attention reads. The
official pipeline pads to ``caption_max_length`` (800) tokens, prepends special-token embeddings from
``example/assets/special_tokens.npz`` (run.sh sets PAD_HQ and PAD_DURATION: a duration token that counts
the chunks still to come, then the HQ token, then the caption) and truncates back to 800.
"""
from __future__ import annotations

import hashlib
import re
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

# special token name -> (npz array, row) as in the official prompt_process.py
SPECIAL_TOKEN_ROWS = {
    "CAPTION_TOKEN": ("caption_token", None), "LOGO_TOKEN": ("logo_token", None),
    "TRANS_TOKEN": ("other_tokens", 0), "HQ_TOKEN": ("other_tokens", 1),
    "STATIC_FIRST_FRAMES_TOKEN": ("other_tokens", 2), "DYNAMIC_FIRST_FRAMES_TOKEN": ("other_tokens", 3),
    "BORDERNESS_TOKEN": ("other_tokens", 4), "THREE_D_MODEL_TOKEN": ("other_tokens", 15),
    "TWO_D_ANIME_TOKEN": ("other_tokens", 16),
}
DURATION_TOKEN = "DURATION_TOKEN"  # DURATION_TOKEN_{n}: n chunks remain; rows 7..14 of other_tokens


def load_special_tokens(file: str | Path) -> dict[str, torch.Tensor]:
    """special_tokens.npz -> name -> (1, caption_channels) float16 (as the official code casts them)."""
    from jensenkv.models.loaders import FETCH_HINT, MissingWeightsError

    file = Path(file).expanduser()
    if not file.is_file():
        raise MissingWeightsError(f"MAGI-1 special tokens not found: expected {file} (example/assets/special_tokens.npz "
                                  f"of SandAI-org/MAGI-1); {FETCH_HINT}")
    data = np.load(file)
    out = {}
    for name, (array, row) in SPECIAL_TOKEN_ROWS.items():
        values = data[array] if row is None else data[array][row:row + 1]
        out[name] = torch.tensor(values.astype(np.float16)).reshape(1, -1)
    for i in range(8):
        out[f"{DURATION_TOKEN}_{i + 1}"] = torch.tensor(data["other_tokens"][7 + i:8 + i].astype(np.float16))
    return out


def pad_special_tokens(embeds: torch.Tensor, mask: torch.Tensor, keys: list[str], tokens: dict[str, torch.Tensor],
                       num_chunks: int, max_length: int) -> list[torch.Tensor]:
    """Per-chunk valid caption tokens after prepending ``keys`` in order (each lands in front of the last).

    embeds (L, D) padded caption; mask (L,) its valid tokens. DURATION_TOKEN picks, for chunk i, the token of
    min(num_chunks - i - 1, 7) + 1 remaining chunks.
    """
    out = []
    for i in range(num_chunks):
        e, m = embeds, mask
        for key in keys:
            name = f"{DURATION_TOKEN}_{min(num_chunks - i - 1, 7) + 1}" if key == DURATION_TOKEN else key
            if name not in tokens:
                raise ValueError(f"special token {key!r} is not allowed: use one of "
                                 f"{sorted(SPECIAL_TOKEN_ROWS) + [DURATION_TOKEN]}")
            tok = tokens[name].to(e.device, e.dtype)  # (1, D)
            e = torch.cat([tok, e])[:max_length]
            m = torch.cat([torch.ones(1, dtype=m.dtype, device=m.device), m])[:max_length]
        out.append(e[m.bool()])
    return out


def clean_prompt(text: str) -> str:
    """The part of the official caption cleaner (DeepFloyd-IF's ``clean_caption``) that changes plain prompts:
    URL-unquote, lower case, one dash and quote style, collapsed whitespace. Its web-scrape filters (URLs,
    HTML, ids, CJK ranges, shop phrases) are not ported: they leave ordinary prompts unchanged."""
    text = urllib.parse.unquote_plus(str(text)).strip().lower()
    text = re.sub(r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0"
                  r"\uFE31\uFE32\uFE58\uFE63\uFF0D]+", "-", text)
    text = re.sub(r"[`´«»“”¨]", '"', text)
    text = re.sub(r"[‘’]", "'", text)
    return re.sub(r"\s+", " ", text).strip()


class MagiT5PromptEncoder:
    """T5 encoder states of the prompt, padded to ``max_length`` (800), special tokens prepended per chunk."""

    def __init__(self, tokenizer: Any, text_encoder: nn.Module, max_length: int = 800,
                 special_tokens: dict[str, torch.Tensor] | None = None, special_token_keys: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval()
        self.max_length = max_length
        self.special_tokens = special_tokens or {}
        self.special_token_keys = list(special_token_keys)
        if self.special_token_keys and not self.special_tokens:
            raise ValueError(f"special_token_keys={self.special_token_keys} need the special tokens file")

    @torch.no_grad()
    def __call__(self, prompt: str, num_chunks: int) -> list[torch.Tensor]:
        tok = self.tokenizer([clean_prompt(prompt)], max_length=self.max_length, padding="max_length", truncation=True,
                             return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
        device = next(self.text_encoder.parameters()).device
        states = self.text_encoder(input_ids=tok.input_ids.to(device),
                                   attention_mask=tok.attention_mask.to(device)).last_hidden_state  # (1, L, D)
        return pad_special_tokens(states[0].float(), tok.attention_mask[0].to(device), self.special_token_keys,
                                  self.special_tokens, num_chunks, self.max_length)


class TinyPromptEncoder(nn.Module):
    """A seeded stand-in for T5 (no weights): each word maps to a fixed random vector of a small table."""

    def __init__(self, channels: int, max_length: int, vocab: int = 512, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, channels, generator=gen), requires_grad=False)
        self.vocab = vocab
        self.max_length = max_length

    def token_ids(self, prompt: str) -> list[int]:
        words = prompt.lower().split() or [""]
        return [int(hashlib.sha256(w.encode()).hexdigest(), 16) % self.vocab for w in words][: self.max_length]

    @torch.no_grad()
    def forward(self, prompt: str, num_chunks: int) -> list[torch.Tensor]:
        ids = torch.tensor(self.token_ids(prompt), device=self.table.device)
        return [self.table[ids]] * num_chunks  # (L, channels) per chunk
