"""Device code of the fused cached-attention kernel (see ``triton_kernel`` for the contract).

Loaded by ``triton_kernel._kernel`` under a mode-specific module name, so that ``triton.jit`` sees the
TRITON_INTERPRET setting of the moment it is first used. Layouts (all contiguous):
Q, QR (B, Hq, M, D) float32 query and rotated query; QB (B, Hq, M, NB) bias query columns;
KC/VC (B, Hkv, N, D*bits/8) uint8 packed codes; KS/KZ, VS/VZ (B, Hkv, R, G) steps and zero points in
their stored dtypes; KROW/VROW (N,) int32 stat row of each token; KF/VF (B, Hkv, NF, D/Dv) float32
full-precision keys and values; O, OF (B, Hq, M, Dv) outputs of the quantized and full-precision
parts (each divided by the common softmax sum); LSE (B, Hq, M); strength (Hq,) float32 per-query-head strength
(read by the elementwise bias only: the other biases carry it in QB).
"""
import triton
import triton.language as tl

BIAS_NONE = tl.constexpr(0)
BIAS_TAYLOR = tl.constexpr(1)
BIAS_SERIES = tl.constexpr(2)
BIAS_ELEMENTWISE = tl.constexpr(3)


@triton.jit
def row_max(x):
    """Max over axis 1 (tl.max without the standard library's jit wrapper, which the interpreter
    cannot call when triton was imported before TRITON_INTERPRET was set)."""
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@triton.jit
def row_sum(x):
    """Sum over axis 1 (see row_max)."""
    return tl.reduce(x, 1, tl.standard._sum_combine)


@triton.jit
def load_quantized(C, S, Z, ROW, base_c, base_s, offs_n, mask_n, offs_d,
                   BITS: tl.constexpr, G: tl.constexpr, DIM: tl.constexpr, HAS_ZERO: tl.constexpr,
                   ZOFF: tl.constexpr):
    """(BLOCK_N, DIM) float32 dequantized rows: (code - zero) * step, stats gathered per element."""
    PER: tl.constexpr = 8 // BITS
    NBYTES: tl.constexpr = DIM // PER
    CS: tl.constexpr = DIM // G
    m2 = mask_n[:, None]
    byte = tl.load(C + base_c + offs_n[:, None] * NBYTES + (offs_d // PER)[None, :], mask=m2, other=0)
    code = ((byte.to(tl.int32) >> ((offs_d % PER) * BITS)[None, :]) & ((1 << BITS) - 1)).to(tl.float32)
    row = tl.load(ROW + offs_n, mask=mask_n, other=0)
    stat = base_s + row[:, None] * G + (offs_d // CS)[None, :]
    step = tl.load(S + stat, mask=m2, other=0).to(tl.float32)
    if HAS_ZERO:
        zero = tl.load(Z + stat, mask=m2, other=0).to(tl.float32) + ZOFF
    else:
        zero = ZOFF
    return (code - zero) * step


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
def cached_attention_kernel(
    Q, QR, QB, KC, KS, KZ, KROW, VC, VS, VZ, VROW, KF, VF, COEF, O, OF, LSE,
    HQ, HKV, M, N, RK, RV, NF, NB, scale, u_scale, half_scale, strength,
    DIM: tl.constexpr, DV: tl.constexpr, GROUP: tl.constexpr,
    KBITS: tl.constexpr, KG: tl.constexpr, K_HAS_ZERO: tl.constexpr, KZOFF: tl.constexpr,
    VBITS: tl.constexpr, VG: tl.constexpr, V_HAS_ZERO: tl.constexpr, VZOFF: tl.constexpr,
    BIAS: tl.constexpr, TERMS: tl.constexpr, SMALL_TERMS: tl.constexpr, UNROLL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)  # b * HQ + query head
    b = bh // HQ
    hkv = (bh % HQ) // GROUP
    bkv = b * HKV + hkv
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_d = tl.arange(0, DIM)
    offs_dv = tl.arange(0, DV)
    offs_nb = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc_q = tl.full([BLOCK_M, DV], 0.0, tl.float32)
    acc_f = tl.full([BLOCK_M, DV], 0.0, tl.float32)
    q_rows = bh * M + offs_m
    # 1. quantized cached tiles (rotated basis), corrected
    if N > 0:
        qr = tl.load(QR + q_rows[:, None] * DIM + offs_d[None, :], mask=mask_m[:, None], other=0.0)
        if BIAS == BIAS_TAYLOR or BIAS == BIAS_SERIES:
            if not UNROLL:
                offs_g = tl.arange(0, KG)
        for start in range(0, N, BLOCK_N):
            offs_n = start + offs_nb
            mask_n = offs_n < N
            k = load_quantized(KC, KS, KZ, KROW, bkv * N * (DIM * KBITS // 8), bkv * RK * KG, offs_n, mask_n,
                               offs_d, KBITS, KG, DIM, K_HAS_ZERO, KZOFF)  # (BLOCK_N, DIM)
            s = tl.dot(qr, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N)
            if BIAS != BIAS_NONE:
                row = tl.load(KROW + offs_n, mask=mask_n, other=0)
                stat = bkv * RK * KG + row * KG  # (BLOCK_N,) first group of each key's stats
                bias = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
                if BIAS == BIAS_TAYLOR:
                    if UNROLL:
                        for j in tl.static_range(KG):
                            st = tl.load(KS + stat + j, mask=mask_n, other=0).to(tl.float32)
                            cq = tl.load(QB + q_rows * NB + j, mask=mask_m, other=0.0)
                            bias += cq[:, None] * (st * st)[None, :]
                    else:
                        st = tl.load(KS + stat[:, None] + offs_g[None, :], mask=mask_n[:, None],
                                     other=0).to(tl.float32)  # (BLOCK_N, KG)
                        cq = tl.load(QB + q_rows[:, None] * NB + offs_g[None, :], mask=mask_m[:, None], other=0.0)
                        bias = tl.dot(cq, tl.trans(st * st), input_precision="ieee")
                elif BIAS == BIAS_SERIES:
                    if UNROLL:
                        for j in tl.static_range(KG):
                            st = tl.load(KS + stat + j, mask=mask_n, other=0).to(tl.float32) * u_scale
                            u2 = st * st
                            power = u2
                            for t in tl.static_range(TERMS):
                                cq = tl.load(QB + q_rows * NB + t * KG + j, mask=mask_m, other=0.0)
                                bias += cq[:, None] * power[None, :]
                                power = power * u2
                    else:
                        st = tl.load(KS + stat[:, None] + offs_g[None, :], mask=mask_n[:, None],
                                     other=0).to(tl.float32) * u_scale  # (BLOCK_N, KG)
                        u2 = st * st
                        power = u2
                        for t in tl.static_range(TERMS):
                            cq = tl.load(QB + q_rows[:, None] * NB + t * KG + offs_g[None, :],
                                         mask=mask_m[:, None], other=0.0)  # (BLOCK_M, KG)
                            bias += tl.dot(cq, tl.trans(power), input_precision="ieee")
                            power = power * u2
                else:  # BIAS_ELEMENTWISE: log(sinh x / x) channel by channel
                    CS: tl.constexpr = DIM // KG
                    for c in range(DIM):
                        qc = tl.load(QR + q_rows * DIM + c, mask=mask_m, other=0.0)
                        st = tl.load(KS + stat + c // CS, mask=mask_n, other=0).to(tl.float32)
                        bias += log_sinhc(half_scale * qc[:, None] * st[None, :], COEF, SMALL_TERMS)
                    bias = bias * tl.load(strength + bh % HQ)
                s = s - bias
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, row_max(s))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + row_sum(p)
            v = load_quantized(VC, VS, VZ, VROW, bkv * N * (DV * VBITS // 8), bkv * RV * VG, offs_n, mask_n,
                               offs_dv, VBITS, VG, DV, V_HAS_ZERO, VZOFF)  # (BLOCK_N, DV)
            acc_q = acc_q * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            acc_f = acc_f * alpha[:, None]
            m_i = m_new
    # 2. full-precision keys (sinks, in-flight and current chunk), original basis, never corrected
    if NF > 0:
        q = tl.load(Q + q_rows[:, None] * DIM + offs_d[None, :], mask=mask_m[:, None], other=0.0)
        for start in range(0, NF, BLOCK_N):
            offs_n = start + offs_nb
            mask_n = offs_n < NF
            k = tl.load(KF + (bkv * NF + offs_n[:, None]) * DIM + offs_d[None, :], mask=mask_n[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            s = tl.where(mask_n[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, row_max(s))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + row_sum(p)
            v = tl.load(VF + (bkv * NF + offs_n[:, None]) * DV + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
            acc_f = acc_f * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            acc_q = acc_q * alpha[:, None]
            m_i = m_new
    out = q_rows[:, None] * DV + offs_dv[None, :]
    tl.store(O + out, acc_q / l_i[:, None], mask=mask_m[:, None])
    tl.store(OF + out, acc_f / l_i[:, None], mask=mask_m[:, None])
    tl.store(LSE + q_rows, m_i + tl.log(l_i), mask=mask_m)

