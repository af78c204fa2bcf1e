"""The no-cache reference of one WorldPlay chunk: ONE masked forward over [text; context; current].

Every block runs the text rows (text stream at t = 0), the context rows (the memory frames, clean, at the
context timestep) and the current rows (the chunk at its timestep) together, with temporal RoPE positions
0..n+F-1, and one SDPA per branch under a boolean mask (research/worldplay.md section 8.7):
- text rows see text only;
- context rows see [text | context] (bidirectional);
- current rows see everything.
The ProPE branch has vision queries only (P^T q) over [text k | P^-1 k]. With ``frozen`` (the ``append``
memory), the current rows read, for the first context frames, the K/V those frames had when they were
written (given), instead of this pass's recomputation: the extra key columns are masked for every other row.

Nothing here touches a cache, a quantizer or the suite's attention backends: it is what the cached path
(``WorldPlayCaches``) must reproduce in full precision.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from jensenkv.models.worldplay.blocks import sdpa
from jensenkv.models.worldplay.model import CameraInputs, TextInputs, WorldPlayTransformer
from jensenkv.models.worldplay.prope import CameraTransforms
from jensenkv.models.worldplay.rope import rope_table

KV_NAMES = ("k", "v", "k_prope", "v_prope")


def _cat_camera(a: CameraInputs, b: CameraInputs) -> CameraInputs:
    return CameraInputs(torch.cat([a.viewmats, b.viewmats], 1), torch.cat([a.ks, b.ks], 1), torch.cat([a.action, b.action], 1))


@torch.no_grad()
def masked_forward(model: WorldPlayTransformer, text: TextInputs, x_ctx: torch.Tensor | None, t_ctx: float,
                   cam_ctx: CameraInputs | None, x_cur: torch.Tensor, t_cur: float | torch.Tensor,
                   cam_cur: CameraInputs, frozen: Sequence[Sequence[dict[str, torch.Tensor]]] | None = None,
                   ) -> tuple[torch.Tensor, list[list[dict[str, torch.Tensor]]]]:
    """x_ctx (B, 2C+1, n, H, W) or None (no memory), x_cur (B, 2C+1, F, H, W) -> (velocity of the current
    frames (B, out, F, H, W), per video per block the context rows' {k, v, k_prope, v_prope}, each
    (1, H, n*T, D)). ``frozen[b][l]``: the same dict for the first m context frames, read by the current rows."""
    outs, kvs = [], []
    for b in range(x_cur.shape[0]):
        own = slice(b, b + 1)
        fz = None if frozen is None else frozen[b]
        sub_text = TextInputs(*(None if t is None else t[own] for t in (text.text_states, text.text_mask, text.byt5_states,
                                                                        text.byt5_mask, text.vision_states)))
        v, kv = _one_video(model, sub_text, None if x_ctx is None else x_ctx[own], t_ctx, _video(cam_ctx, own),
                           x_cur[own], _row(t_cur, b), _video(cam_cur, own), fz)
        outs.append(v)
        kvs.append(kv)
    return torch.cat(outs), kvs


def _video(cam: CameraInputs | None, own: slice) -> CameraInputs | None:
    return None if cam is None else CameraInputs(cam.viewmats[own], cam.ks[own], cam.action[own])


def _row(t: float | torch.Tensor, b: int) -> float | torch.Tensor:
    t = torch.as_tensor(t, dtype=torch.float32)
    return t if t.ndim == 0 else t[b:b + 1]


def _one_video(model, text, x_ctx, t_ctx, cam_ctx, x_cur, t_cur, cam_cur, frozen):
    cfg = model.config
    amp = model.amp
    n = 0 if x_ctx is None else x_ctx.shape[2]
    f = x_cur.shape[2]
    x = x_cur if x_ctx is None else torch.cat([x_ctx, x_cur], dim=2)  # (1, 2C+1, n+F, H, W)
    camera = cam_cur if cam_ctx is None else _cat_camera(cam_ctx, cam_cur)
    th, tw = x.shape[3] // cfg.patch_size[1], x.shape[4] // cfg.patch_size[2]
    tokens = th * tw
    t_frames = torch.cat([torch.full((1, n), float(t_ctx)), model.frame_timesteps(t_cur, 1, f).cpu()], dim=1)  # (1, n+F)
    vec = model.frame_vectors(t_frames.to(model.device), camera.action)  # (1, n+F, C)
    cams = CameraTransforms.build(model.cast_inputs(camera.viewmats), model.cast_inputs(camera.ks))
    cos, sin = (r.to(x.device) for r in rope_table(range(n + f), th, tw, cfg.rope_dim_list, cfg.rope_theta))
    txt = model.text_tokens(text, 0)  # (1, L, C)
    vec_txt = model.time_in(torch.zeros(1, device=model.device), model.precision.fp32_timesteps)
    img = model.img_in(x)  # (1, (n+F)*T, C)

    n_txt, n_ctx, n_all = txt.shape[1], n * tokens, (n + f) * tokens
    m = 0 if frozen is None else frozen[0]["k"].shape[2]  # frozen context tokens
    # key columns: [text | vision (this pass) | frozen]; rows: [text | vision]
    cols = n_txt + n_all + m
    mask = torch.zeros(n_txt + n_all, cols, dtype=torch.bool)
    mask[:n_txt, :n_txt] = True                                    # text -> text
    mask[n_txt:n_txt + n_ctx, :n_txt + n_ctx] = True               # context -> text, context
    mask[n_txt + n_ctx:, :n_txt + n_all] = True                    # current -> everything
    if m:
        mask[n_txt + n_ctx:, n_txt:n_txt + m] = False              # ... but the held frames as written
        mask[n_txt + n_ctx:, n_txt + n_all:] = True
    mask = mask.to(x.device)
    kv_out = []
    for layer, block in enumerate(model.double_blocks):
        t_mods = block.txt_mods(vec_txt)
        tq, tk, tv = block.txt_qkv(txt, t_mods, amp)  # (1, H, L, D)
        mods = block.img_mods(vec)
        qkv = block.img_qkv(img, mods, tokens, (cos, sin), cams, amp)
        extra_k = [] if not m else [frozen[layer]["k"].to(qkv.k.dtype)]
        extra_v = [] if not m else [frozen[layer]["v"].to(qkv.v.dtype)]
        extra_kp = [] if not m else [frozen[layer]["k_prope"].to(qkv.k.dtype)]
        extra_vp = [] if not m else [frozen[layer]["v_prope"].to(qkv.v.dtype)]
        q_all = torch.cat([tq.to(qkv.q.dtype), qkv.q], 2)
        k_all = torch.cat([tk.to(qkv.k.dtype), qkv.k, *extra_k], 2)
        v_all = torch.cat([tv.to(qkv.v.dtype), qkv.v, *extra_v], 2)
        o = sdpa(q_all, k_all, v_all, mask)  # (1, H, L + N, D)
        kp_all = torch.cat([tk.to(qkv.k.dtype), qkv.k_prope, *extra_kp], 2)
        vp_all = torch.cat([tv.to(qkv.v.dtype), qkv.v_prope, *extra_vp], 2)
        o_prope = sdpa(qkv.q_prope, kp_all, vp_all, mask[n_txt:])  # (1, H, N, D)
        kv_out.append({name: getattr(qkv, name)[:, :, :n_ctx].clone() for name in KV_NAMES})
        txt = block.txt_out(txt, o[:, :, :n_txt], t_mods, amp)
        img = block.img_out(img, o[:, :, n_txt:], o_prope, mods, tokens, cams, amp)
    out = model.final_layer(img, vec, tokens, amp)[:, n_ctx:]  # the current rows
    return model.unpatchify(out, f, th, tw), kv_out
