"""The WorldPlay transformer's pieces against known answers: ProPE matrices and their block action, the
camera and action branches, the text stream (padding dropped, token order), and the precision switches
(each changes the tiny model's output, and only where it should)."""
from __future__ import annotations

import pytest
import torch
import worldplay_model_kit as kit

from jensenkv.models.worldplay.blocks import sdpa
from jensenkv.models.worldplay.config import WorldPlayPrecision, WorldPlayTransformerConfig
from jensenkv.models.worldplay.prope import CameraTransforms, apply_blocks
from jensenkv.models.worldplay.rope import apply_rope, rope_table


@pytest.fixture(scope="module")
def model():
    return kit.tiny_model()


def _run(model, cam=None, text=None, chunks=2, cache=None):
    """Velocities of the first ``chunks`` chunks (rebuild memory) with the given camera/action and prompt."""
    driver = kit.Driver(model, kit.make_caches(model, cache), text=text)
    if cam is not None:
        driver.cam = cam
    return torch.cat([driver.run(i).v.float() for i in range(chunks)], dim=2)


def test_8b_shape():
    cfg = WorldPlayTransformerConfig()
    assert (cfg.head_dim, cfg.in_channels, cfg.num_layers, cfg.rope_dim_list, cfg.rope_theta) == (128, 65, 54, (16, 56, 56), 256.0)


def test_prope_matrices_and_block_action_match_explicit_math():
    cam = kit.camera(2, 3, seed=5)
    t = CameraTransforms.build(cam.viewmats.double(), cam.ks.double())
    eye = torch.eye(4, dtype=torch.float64).expand_as(t.p)
    assert torch.allclose(t.p @ t.p_inv, eye, atol=1e-6)  # the rotations are orthogonal to float32 precision
    # P = lift(diag(fx, fy, 1)) @ w2c: the principal point is dropped
    k = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    k[..., 0, 0], k[..., 1, 1], k[..., 2, 2], k[..., 3, 3] = cam.ks[..., 0, 0], cam.ks[..., 1, 1], 1.0, 1.0
    assert torch.allclose(t.p, k @ cam.viewmats.double(), atol=1e-12)
    feats = torch.randn(2, 2, 3 * 5, 8, dtype=torch.float64)  # 3 frames x 5 tokens, 2 blocks of 4 channels
    out = apply_blocks(feats, t.p_inv)
    for b in range(2):
        for s in range(15):
            for blk in range(2):
                want = t.p_inv[b, s // 5] @ feats[b, :, s, 4 * blk:4 * blk + 4].T  # (4, H)
                assert torch.allclose(out[b, :, s, 4 * blk:4 * blk + 4], want.T, atol=1e-12)


def test_prope_attention_depends_on_relative_poses_only():
    """P^T q . P^-1 k = q^T P_i P_j^-1 k: a rigid change of world frame (w2c -> w2c G) leaves the ProPE
    attention among vision tokens unchanged; moving one camera alone does not (control)."""
    cam = kit.camera(1, 3, seed=6)
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64) for _ in range(3))

    def attention(viewmats):
        t = CameraTransforms.build(viewmats, cam.ks.double())
        return apply_blocks(sdpa(apply_blocks(q, t.p_t), apply_blocks(k, t.p_inv), apply_blocks(v, t.p_inv)), t.p)

    g = torch.eye(4, dtype=torch.float64)
    g[:3, :3] = kit.rotation(torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64))
    g[:3, 3] = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    base = attention(cam.viewmats.double())
    assert torch.allclose(attention(cam.viewmats.double() @ g), base, atol=1e-5)  # float32-orthogonal rotations
    moved = cam.viewmats.double().clone()
    moved[:, 1] = moved[:, 1] @ g
    assert (attention(moved) - base).abs().max() > 1e-3


def test_rope_reframing_is_relative():
    """Rotating q and k at positions shifted by a common offset leaves q . k unchanged (the reframing to
    0..n-1 loses nothing between vision tokens); a different shift of the keys changes it (control)."""
    q, k = torch.randn(1, 2, 12, 32), torch.randn(1, 2, 12, 32)

    def scores(q_pos, k_pos):
        qc, qs = rope_table(q_pos, 2, 3, (8, 12, 12), 256.0)
        kc, ks = rope_table(k_pos, 2, 3, (8, 12, 12), 256.0)
        return apply_rope(q, qc, qs) @ apply_rope(k, kc, ks).transpose(-1, -2)

    base = scores([0, 1], [0, 1])
    assert torch.allclose(scores([7, 8], [7, 8]), base, atol=1e-4)
    assert (scores([7, 8], [6, 7]) - base).abs().max() > 1e-2


def test_camera_and_action_branches_act_and_zero_init_switches_them_off(model):
    base = _run(model)
    other = kit.camera(1, 20, seed=11)
    same_actions = kit.Driver(model, kit.make_caches(model)).cam
    cam_only = kit.CameraInputs(other.viewmats, other.ks, same_actions.action)
    act_only = kit.CameraInputs(same_actions.viewmats, same_actions.ks, other.action)
    assert kit.rel_err(_run(model, cam_only), base) > 1e-3
    assert kit.rel_err(_run(model, act_only), base) > 1e-3
    off = kit.tiny_model()
    with torch.no_grad():  # WorldPlay's zero-initialised additions: the base model, blind to camera and action
        for block in off.double_blocks:
            block.img_attn_prope_proj.weight.zero_()
            block.img_attn_prope_proj.bias.zero_()
        off.action_in.mlp[2].weight.zero_()
        off.action_in.mlp[2].bias.zero_()
    assert torch.equal(_run(off, cam_only), _run(off))
    assert torch.equal(_run(off, act_only), _run(off))


def test_text_stream_drops_padding_and_orders_tokens(model):
    padded = kit.text_inputs(model, lengths=(5,), pad=3)
    unpadded = kit.TextInputs(padded.text_states[:, :5], padded.text_mask[:, :5], padded.byt5_states[:, :2],
                              padded.byt5_mask[:, :2], padded.vision_states)
    a, b = model.text_stream(padded)[0], model.text_stream(unpadded)[0]
    for (ka, va), (kb, vb) in zip(a, b):
        assert ka.shape[2] == 4 + 2 + 5  # image tokens, glyph tokens, prompt tokens; padding gone
        assert kit.rel_err(ka, kb) < 1e-6 and kit.rel_err(va, vb) < 1e-6
    tokens = model.text_tokens(unpadded, 0)
    vision = model.vision_in(unpadded.vision_states, False) + model.cond_type_embedding.weight[2]
    assert torch.equal(tokens[:, :4], vision)  # image tokens first
    zero = kit.TextInputs(unpadded.text_states, unpadded.text_mask, unpadded.byt5_states, unpadded.byt5_mask,
                          torch.zeros_like(unpadded.vision_states))
    none = kit.TextInputs(unpadded.text_states, unpadded.text_mask, unpadded.byt5_states, unpadded.byt5_mask, None)
    assert torch.equal(model.text_tokens(zero, 0), model.text_tokens(none, 0))  # t2v: image tokens masked out
    assert model.text_tokens(none, 0).shape[1] == 7


# precision ------------------------------------------------------------------------------------------------

def _bf16(**kw) -> WorldPlayPrecision:
    return WorldPlayPrecision(dtype="bfloat16", **kw)


def _velocity(model, t: float, cam=None):
    caches = kit.make_caches(model)
    driver = kit.Driver(model, caches)
    driver.t_cur = torch.full_like(driver.t_cur, t)
    if cam is not None:
        driver.cam = cam
    driver.run(0)
    return driver.run(1).v.float()


def test_fp32_timesteps_switch():
    on, off = kit.tiny_model(precision=_bf16()), kit.tiny_model(precision=_bf16(fp32_timesteps=False))
    assert kit.rel_err(_velocity(off, 937.5), _velocity(on, 937.5)) > 1e-3  # 937.5 -> 936 in BF16
    assert torch.equal(_velocity(off, 624.0), _velocity(on, 624.0))  # exact in BF16: nothing to round


def test_autocast_emulation_switch():
    on, off = kit.tiny_model(precision=_bf16(autocast=True)), kit.tiny_model(precision=_bf16())
    assert kit.rel_err(_velocity(on, 800.0), _velocity(off, 800.0)) > 1e-3
    fp_on, fp_off = kit.tiny_model(precision=WorldPlayPrecision(autocast=True)), kit.tiny_model()
    assert torch.equal(_velocity(fp_on, 800.0), _velocity(fp_off, 800.0))  # float32 weights: no effect


def test_bf16_camera_inputs_switch():
    cam = kit.camera(1, 20, seed=2)
    on, off = kit.tiny_model(precision=WorldPlayPrecision(inputs_dtype="bfloat16")), kit.tiny_model()
    assert kit.rel_err(_velocity(on, 800.0, cam), _velocity(off, 800.0, cam)) > 1e-4
    same = kit.tiny_model(precision=WorldPlayPrecision(inputs_dtype="float32"))
    assert torch.equal(_velocity(same, 800.0, cam), _velocity(off, 800.0, cam))  # a no-op cast changes nothing


def test_official_precision_runs_and_differs_from_float32():
    official = kit.tiny_model(precision=WorldPlayPrecision.official())
    assert official.dtype == torch.bfloat16
    v = _velocity(official, 937.5)
    assert torch.isfinite(v).all()
    assert kit.rel_err(v, _velocity(kit.tiny_model(), 937.5)) > 1e-3


@pytest.mark.parametrize("kwargs,key", [({"num_heads": 3}, "hidden_size"), ({"rope_dim_list": (8, 8, 8)}, "rope_dim_list"),
                                        ({"patch_size": (2, 1, 1)}, "patch_size"), ({"num_layers": 0}, "num_layers")])
def test_bad_config_is_refused(kwargs, key):
    with pytest.raises(ValueError, match=f"worldplay.{key}=") as err:
        WorldPlayTransformerConfig.tiny(**kwargs)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="dtype='fp8'"):
        WorldPlayPrecision(dtype="fp8")
