"""Device code of the fused cached-attention kernel (see ``triton_kernel`` for the contract).

Loaded by ``triton_kernel._kernel`` under a mode-specific module name, so that ``triton.jit`` sees the
TRITON_INTERPRET setting of the moment it is first used. Every tensor is read through its strides (views
of the cache's buffers, of the caller's q / k / v: nothing is copied to feed the kernel):
Q, QR (B, Hq, M, D) query and the rotated query (quantized keys live in the rotated basis), any float dtype;
QB (B, Hq, M, NB) float32 bias query columns (contiguous); QMAX () float32 max |QR| (exact series scale);
KC/VC (B, Hkv, N, D*bits/8) uint8 packed codes (last dim contiguous; VC the (B, Hkv, N, Dv) full-precision
values when VFULL: cache.values=none); KS/KZ, VS/VZ (B, Hkv, R, G) steps and
stored zeros in their stored dtypes (float16 / bfloat16 / float32 / float8_e4m3fn steps; zeros as stored),
with equal strides; KROW/VROW (N,) int32 stat row of each token (only for per-channel KIVI layouts; a token
layout's row is the token); KF/VF (B, Hkv, NF, D/Dv) cached full-precision keys and values (sinks, BF16
caches); KX/VX (B, Hkv, NX, D/Dv) the current chunk; O, OF (B, Hq, M, Dv) float32 outputs of the quantized
and full-precision parts (OF only when the values are rotated: they are un-rotated after the kernel);
LSE (B, Hq, M) float32 natural log-sum-exp; STRENGTH (Hq,) float32 (read by the elementwise bias only).

Dots take DOT operands: 0 float32 (IEEE, for the oracle tests; the interpreter's bf16 dots are wrong, so
triton_kernel never asks it for 1), 1 bfloat16, 2 float16 (tensor cores, float32 accumulation). Softmax runs
in base 2 (log2 e folded into the scale), so the running max m_i is in log2 units. KROW/VROW tables hold rows
relative to their first entry (absolute rows of a store's buffer, or renumbered by triton_packing.pack_run).
"""
import triton
import triton.language as tl

BIAS_NONE = tl.constexpr(0)
BIAS_TAYLOR = tl.constexpr(1)
BIAS_EXACT = tl.constexpr(2)
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
SERIES_MAX_ARG = tl.constexpr(1.5)  # as jensenkv.correction.SERIES_MAX_ARG (checked by triton_kernel)


# The reductions' combine functions are jitted here, not taken from tl.standard: triton.jit fixes a function's
# mode (interpreted or compiled) when it decorates, and tl.standard is decorated once, at `import triton`. Ours
# follow this module's load (triton_kernel._kernel, triton_aot._device_kernel), so the kernel compiles when
# triton was imported under TRITON_INTERPRET=1, and interprets when it was imported without.
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _sum_combine(a, b):
    return a + b


@triton.jit
def row_max(x):
    """Max over axis 1 (tl.max without the standard library: see _max_combine)."""
    return tl.reduce(x, 1, _max_combine)


@triton.jit
def row_sum(x):
    """Sum over axis 1 (see row_max)."""
    return tl.reduce(x, 1, _sum_combine)


@triton.jit
def as_operand(x, DOT: tl.constexpr):
    """x in the dots' operand dtype."""
    if DOT == 1:
        return x.to(tl.bfloat16)
    elif DOT == 2:
        return x.to(tl.float16)
    else:
        return x.to(tl.float32)


@triton.jit
def mma(a, b, DOT: tl.constexpr):
    """a @ b with float32 accumulation: IEEE float32 in the oracle mode, tensor cores otherwise."""
    if DOT == 0:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def mma_f32(a, b, DOT: tl.constexpr):
    """a @ b of float32 operands (the bias's narrow dots): IEEE in the oracle mode, tf32 tensor cores otherwise."""
    if DOT == 0:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision="tf32")


@triton.jit
def stat_rows(ROW, offs_n, mask_n, ROWS: tl.constexpr):
    """(BLOCK_N,) stat row of each token relative to the run's first row: the token itself (token layouts),
    or the per-channel layout's row table (its first entry is the run's first row)."""
    if ROWS:
        return tl.load(ROW + offs_n, mask=mask_n, other=0) - tl.load(ROW)
    else:
        return offs_n


@triton.jit
def load_quantized(C, S, Z, base_c, base_s, sc_n, ss_r, row, offs_n, mask_n,
                   BITS: tl.constexpr, G: tl.constexpr, DIM: tl.constexpr, ZKIND: tl.constexpr,
                   ZOFF: tl.constexpr, ZSCALE: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_N, DIM) float32 dequantized rows from packed codes and per-(row, group) stats.

    ZKIND: 0 symmetric (x = (code - ZOFF) step), 1 integer zero (x = (code - z - ZOFF) step), 2 fixed-point
    zero (x = (code - z ZSCALE) step), 3 min-aligned (x = code step + z, z the stored group minimum).
    """
    PER: tl.constexpr = 8 // BITS
    NBYTES: tl.constexpr = DIM // PER
    CS: tl.constexpr = DIM // G
    m2 = mask_n[:, None]
    offs_b = tl.arange(0, NBYTES)
    byte = tl.load(C + base_c + offs_n[:, None] * sc_n + offs_b[None, :], mask=m2, other=0).to(tl.int32)
    shifts = tl.arange(0, PER) * BITS  # code i of a byte sits at bits i*BITS (channel byte*PER + i)
    codes = (byte[:, :, None] >> shifts[None, None, :]) & ((1 << BITS) - 1)  # (BLOCK_N, NBYTES, PER)
    code = tl.reshape(codes, (BLOCK_N, DIM)).to(tl.float32)
    offs_g = tl.arange(0, G)
    stat = base_s + row[:, None] * ss_r + offs_g[None, :]  # (BLOCK_N, G)
    step = tl.load(S + stat, mask=m2, other=0.0).to(tl.float32)
    step = tl.reshape(tl.broadcast_to(step[:, :, None], (BLOCK_N, G, CS)), (BLOCK_N, DIM))
    if ZKIND == 0:
        return (code - ZOFF) * step
    else:
        zero = tl.load(Z + stat, mask=m2, other=0.0).to(tl.float32)
        zero = tl.reshape(tl.broadcast_to(zero[:, :, None], (BLOCK_N, G, CS)), (BLOCK_N, DIM))
        if ZKIND == 1:
            return (code - (zero + ZOFF)) * step
        elif ZKIND == 2:
            return (code - zero * ZSCALE) * step
        else:
            return code * step + zero


@triton.jit
def log_sinhc(x, COEF, TERMS: tl.constexpr):
    """log(sinh x / x) elementwise: power series below |x| = 0.5, asymptotic form above."""
    ax = tl.abs(x)
    small = ax < 0.5
    xs = tl.where(small, ax, 0.0)
    x2 = xs * xs
    acc = x2 * 0.0
    for i in tl.static_range(TERMS):
        acc = (acc + tl.load(COEF + TERMS - 1 - i)) * x2
    xl = tl.where(small, 1.0, ax)
    large = xl - tl.log(2.0 * xl) + tl.log(1.0 - tl.exp(-2.0 * xl))
    return tl.where(small, acc, large)


@triton.jit
def attend_full(q, K, V, base_k, base_v, sk_n, sv_n, NK, m_i, l_i, acc, offs_nb, offs_d, offs_dv, scale_log2,
                DOT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax over NK full-precision keys (never corrected): returns the updated (m_i, l_i, acc)."""
    for start in range(0, NK, BLOCK_N):
        offs_n = start + offs_nb
        mask_n = offs_n < NK
        k = tl.load(K + base_k + offs_n[:, None] * sk_n + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        s = mma(q, tl.trans(as_operand(k, DOT)), DOT) * scale_log2  # (BLOCK_M, BLOCK_N)
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, row_max(s))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + row_sum(p)
        v = tl.load(V + base_v + offs_n[:, None] * sv_n + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
        acc = acc * alpha[:, None] + mma(as_operand(p, DOT), as_operand(v, DOT), DOT)
        m_i = m_new
    return m_i, l_i, acc


# Parameter legend of cached_attention_kernel, group by group (strides are in elements; every tensor's last dim
# has unit stride; "Hkv" heads are read as h // GROUP for query head h). Launched by triton_kernel._launch.
#   query        Q (B, Hq, M, D) any float dtype, strides sq_b, sq_h, sq_m; QR (B, Hq, M, D) the query in the
#                quantized keys' rotated basis (Q itself without rotation), strides sr_*
#   bias query   QB (B, Hq, M, NB) float32 contiguous: Taylor NB = G columns strength*scale^2/24*||q_g||^2 (log2
#                units), exact NB = G*TERMS series columns (term-major); QMAX () float32 max |QR| (exact only)
#   quantized K  KC (B, Hkv, N, D*KBITS/8) uint8 packed codes, strides skc_*; KS (B, Hkv, R, KG) steps and KZ
#                (B, Hkv, R, KG) stored zeros (same strides sks_*; R stat rows); KROW (N,) int32 stat row per
#                token (KROWS only: per-channel / tensor layouts)
#   quantized V  VC, svc_*, VS, svs_*, VZ, VROW as for K (VBITS, VG, VROWS); with VFULL, VC is the (B, Hkv, N,
#                Dv) full-precision values (cache.values=none) and VS/VZ/VROW are unused; N: tokens of this run
#   cached full  KF (B, Hkv, NF, D), VF (B, Hkv, NF, Dv): sinks / BF16 chunks, strides skf_*, svf_*; NF tokens
#   current      KX (B, Hkv, NX, D), VX (B, Hkv, NX, Dv): the current chunk, strides skx_*, svx_*; NX tokens
#   bias tables  COEF (SMALL_TERMS,) float32 log(sinh x / x) series coefficients; STRENGTH (Hq,) float32 per-head
#                strengths (the elementwise exact bias only)
#   outputs      O (B, Hq, M, Dv) float32 contiguous; OF (B, Hq, M, Dv) the full-precision part when V_ROT (else
#                a dummy); LSE (B, Hq, M) float32 natural log-sum-exp
#   sizes        HQ query heads, M queries, scale_log2 = scale * log2 e, half_scale = scale / 2
#   compiled     DIM, DV head dims; GROUP = Hq / Hkv; K/V layouts (BITS, G groups, ZKIND / ZOFF / ZSCALE zero
#                convention, ROWS stat-row table, VFULL); BIAS none/taylor/exact; TERMS series terms; SMALL_TERMS;
#                GP = max(16, KG) padded bias width; DOT operand dtype; V_ROT rotated values; BLOCK_M x BLOCK_N tile
@triton.jit
def cached_attention_kernel(
    Q, sq_b, sq_h, sq_m, QR, sr_b, sr_h, sr_m, QB, NB, QMAX,
    KC, skc_b, skc_h, skc_n, KS, sks_b, sks_h, sks_r, KZ, KROW,
    VC, svc_b, svc_h, svc_n, VS, svs_b, svs_h, svs_r, VZ, VROW, N,
    KF, skf_b, skf_h, skf_n, VF, svf_b, svf_h, svf_n, NF,
    KX, skx_b, skx_h, skx_n, VX, svx_b, svx_h, svx_n, NX,
    COEF, STRENGTH, O, OF, LSE, HQ, M, scale_log2, half_scale,
    DIM: tl.constexpr, DV: tl.constexpr, GROUP: tl.constexpr,
    KBITS: tl.constexpr, KG: tl.constexpr, KZKIND: tl.constexpr, KZOFF: tl.constexpr, KZSCALE: tl.constexpr,
    KROWS: tl.constexpr,
    VBITS: tl.constexpr, VG: tl.constexpr, VZKIND: tl.constexpr, VZOFF: tl.constexpr, VZSCALE: tl.constexpr,
    VROWS: tl.constexpr, VFULL: tl.constexpr,
    BIAS: tl.constexpr, TERMS: tl.constexpr, SMALL_TERMS: tl.constexpr, GP: tl.constexpr,
    DOT: tl.constexpr, V_ROT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)  # b * HQ + query head
    b = bh // HQ
    h = bh % HQ
    hkv = h // GROUP  # GQA: query head h reads KV head h // (Hq / Hkv)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_d = tl.arange(0, DIM)
    offs_dv = tl.arange(0, DV)
    offs_nb = tl.arange(0, BLOCK_N)
    offs_gp = tl.arange(0, GP)  # bias columns, zero-padded to a tensor-core width
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, DV], 0.0, tl.float32)
    rows_q = bh * M + offs_m  # rows of the contiguous (B, Hq, M, .) outputs and bias columns
    # 1. the quantized cached run (rotated basis), corrected
    if N > 0:
        base_kc = b * skc_b + hkv * skc_h
        base_ks = b * sks_b + hkv * sks_h
        base_vc = b * svc_b + hkv * svc_h
        base_vs = b * svs_b + hkv * svs_h
        qr32 = tl.load(QR + b * sr_b + h * sr_h + offs_m[:, None] * sr_m + offs_d[None, :],
                       mask=mask_m[:, None], other=0.0).to(tl.float32)  # (BLOCK_M, DIM)
        qr = as_operand(qr32, DOT)
        mask_g = offs_gp < KG
        if BIAS == BIAS_TAYLOR:
            cq = tl.load(QB + rows_q[:, None] * NB + offs_gp[None, :], mask=mask_m[:, None] & mask_g[None, :],
                         other=0.0)  # (BLOCK_M, GP): strength * scale^2/24 * ||q_g||^2, log2 units
        if BIAS == BIAS_EXACT:
            u_scale = half_scale * tl.load(QMAX)
            head_strength = tl.load(STRENGTH + h)
        for start in range(0, N, BLOCK_N):
            offs_n = start + offs_nb
            mask_n = offs_n < N
            row_k = stat_rows(KROW, offs_n, mask_n, KROWS)
            k = load_quantized(KC, KS, KZ, base_kc, base_ks, skc_n, sks_r, row_k, offs_n, mask_n,
                               KBITS, KG, DIM, KZKIND, KZOFF, KZSCALE, BLOCK_N)  # (BLOCK_N, DIM)
            s = mma(qr, tl.trans(as_operand(k, DOT)), DOT) * scale_log2  # (BLOCK_M, BLOCK_N)
            if BIAS != BIAS_NONE:
                st = tl.load(KS + base_ks + row_k[:, None] * sks_r + offs_gp[None, :],
                             mask=mask_n[:, None] & mask_g[None, :], other=0.0).to(tl.float32)  # (BLOCK_N, GP)
                if BIAS == BIAS_TAYLOR:
                    s = s - mma_f32(cq, tl.trans(st * st), DOT)  # the G-wide dot, fused into the score tile
                else:
                    # exact: the series while every |x| = scale/2 |q_c| step <= SERIES_MAX_ARG in this tile
                    # (decided here, on the device), else log(sinh x / x) channel by channel
                    arg = u_scale * tl.reduce(row_max(st), 0, _max_combine)
                    if arg <= SERIES_MAX_ARG:
                        u2 = (st * u_scale) * (st * u_scale)
                        power = u2
                        bias = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
                        for t in tl.static_range(TERMS):
                            cq_t = tl.load(QB + rows_q[:, None] * NB + t * KG + offs_gp[None, :],
                                           mask=mask_m[:, None] & mask_g[None, :], other=0.0)  # (BLOCK_M, GP)
                            bias += mma_f32(cq_t, tl.trans(power), DOT)
                            power = power * u2
                    else:
                        CS: tl.constexpr = DIM // KG
                        bias = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
                        for c in range(DIM):
                            qc = tl.load(QR + b * sr_b + h * sr_h + offs_m * sr_m + c, mask=mask_m,
                                         other=0.0).to(tl.float32)
                            st_c = tl.load(KS + base_ks + row_k * sks_r + c // CS, mask=mask_n,
                                           other=0.0).to(tl.float32)
                            bias += log_sinhc(half_scale * qc[:, None] * st_c[None, :], COEF, SMALL_TERMS)
                        bias = bias * (head_strength * LOG2E)
                    s = s - bias
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, row_max(s))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + row_sum(p)
            if VFULL:  # cache.values=none: VC is the full-precision values (B, Hkv, N, Dv)
                v = tl.load(VC + base_vc + offs_n[:, None] * svc_n + offs_dv[None, :], mask=mask_n[:, None],
                            other=0.0)
            else:
                row_v = stat_rows(VROW, offs_n, mask_n, VROWS)
                v = load_quantized(VC, VS, VZ, base_vc, base_vs, svc_n, svs_r, row_v, offs_n, mask_n,
                                   VBITS, VG, DV, VZKIND, VZOFF, VZSCALE, BLOCK_N)  # (BLOCK_N, DV)
            acc = acc * alpha[:, None] + mma(as_operand(p, DOT), as_operand(v, DOT), DOT)
            m_i = m_new
    # 2. full-precision keys, original basis, never corrected: the cached ones (sinks, BF16), then the current chunk
    m_q = m_i
    if V_ROT:  # rotated quantized values: their sum stays apart (un-rotated after the kernel)
        acc_q = acc
        acc = tl.full([BLOCK_M, DV], 0.0, tl.float32)
    if NF + NX > 0:
        q = as_operand(tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + offs_d[None, :],
                               mask=mask_m[:, None], other=0.0), DOT)
        m_i, l_i, acc = attend_full(q, KF, VF, b * skf_b + hkv * skf_h, b * svf_b + hkv * svf_h, skf_n, svf_n, NF,
                                    m_i, l_i, acc, offs_nb, offs_d, offs_dv, scale_log2, DOT, BLOCK_N)
        m_i, l_i, acc = attend_full(q, KX, VX, b * skx_b + hkv * skx_h, b * svx_b + hkv * svx_h, skx_n, svx_n, NX,
                                    m_i, l_i, acc, offs_nb, offs_d, offs_dv, scale_log2, DOT, BLOCK_N)
    out = rows_q[:, None] * DV + offs_dv[None, :]
    inv = 1.0 / l_i
    if V_ROT:
        shrink = tl.where(m_q == float("-inf"), 0.0, tl.exp2(m_q - m_i))  # the alphas the quantized sum missed
        tl.store(O + out, acc_q * (shrink * inv)[:, None], mask=mask_m[:, None])
        tl.store(OF + out, acc * inv[:, None], mask=mask_m[:, None])
    else:
        tl.store(O + out, acc * inv[:, None], mask=mask_m[:, None])
    tl.store(LSE + rows_q, (m_i + tl.log2(l_i)) * LN2, mask=mask_m)
