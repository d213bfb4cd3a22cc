/*
 * q8_arith.h - the integer arithmetic every int8 kernel shares (the q8_*.c files), and the packed
 * 16-bit helpers their fast variants use.
 *
 * Quantisation (CMSIS-NN's, TFLite's): a real value v is s * (q - zp), q int8. Weights are symmetric
 * (zp 0) with one scale per output channel; activations carry one scale and a zero point; gradients
 * are symmetric. A product sum is an exact int32 accumulator, and it becomes int8 through
 * `et_q8_requantize` (a Q31 multiplier and a power-of-two exponent) plus the output's zero point,
 * clamped to [act_min, act_max] (a fused ReLU / ReLU6, or the full int8 range).
 *
 * Fast variants (ET_Q8_FAST): where the compiler targets the Cortex-M4/M7 DSP extension
 * (__ARM_FEATURE_DSP), the helpers below are the ACLE intrinsics SXTB16, SXTAB16 and SMLAD: two 16-bit
 * multiply-adds per instruction. -DET_Q8_EMULATE_DSP builds the same fast kernels on any host with the
 * helpers written in plain C, so the host tests hold the fast kernels' data movement against the
 * reference too; QEMU then holds the real instructions.
 */
#ifndef ET_Q8_ARITH_H
#define ET_Q8_ARITH_H

#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#define ET_Q8_FAST 1
#define ET_Q8_DSP 1
#elif defined(ET_Q8_EMULATE_DSP)
#define ET_Q8_FAST 1
#define ET_Q8_DSP 0
#else
#define ET_Q8_FAST 0
#define ET_Q8_DSP 0
#endif

/* A hot loop kept a function of its own: gcc inlines a static function called once, and inside a large loop nest
 * the loop's accumulators and pointers then spill to the stack (a load and a store more per step). */
#if defined(__GNUC__)
#define ET_Q8_NOINLINE __attribute__((noinline))
#else
#define ET_Q8_NOINLINE
#endif

/* How an int32 accumulator becomes an int8 output, per output channel. */
typedef struct et_q8_requant {
    const int32_t *mult;  /* [channels] Q31 multipliers, each in [2^30, 2^31) */
    const int32_t *shift; /* [channels] exponents, -31..30: > 0 shifts left first, < 0 rounds right after */
    int32_t out_zp;       /* the output's zero point (0 for a gradient) */
    int32_t act_min;      /* clamp after the zero point: -128..127, or a fused activation's range */
    int32_t act_max;
} et_q8_requant;

static inline int32_t et_q8_sat32(int64_t v)
{
    return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

/* round(v / 2^exponent), halves away from zero (gemmlowp's RoundingDivideByPOT); exponent 0..31. */
static inline int32_t et_q8_rounding_rshift(int32_t v, int exponent)
{
    const int32_t mask = (int32_t)((1u << exponent) - 1u);
    const int32_t rem = v & mask;
    const int32_t threshold = (mask >> 1) + (v < 0 ? 1 : 0);
    /* >> on a negative int32 is arithmetic on every compiler this runtime supports (gcc documents it). */
    return (v >> exponent) + (rem > threshold ? 1 : 0);
}

/* (v * 2^left) saturated to int32, times mult / 2^31 rounded with halves up (SQRDMULH: gemmlowp's and
 * CMSIS-NN's nudge, then a division that truncates), then rounded right by -shift with halves away from
 * zero: CMSIS-NN's arm_nn_requantize, with the left shift saturating.
 * With mult > 0 the nudge-and-truncate is floor((v * mult + 2^30) / 2^31) for either sign of v (for v < 0,
 * truncating (p + 1 - 2^30) / 2^31 toward zero is its ceiling, which is that floor), so it is computed as
 * one multiply-accumulate and a 64-bit shift: no sign test, no branch. */
static inline int32_t et_q8_requantize(int32_t v, int32_t mult, int32_t shift)
{
    int32_t h;

    if (shift < 0 && v > -(1 << 30) && v < (1 << 30)) {
        /* The usual case, in fewer instructions, same bits: with |v| < 2^30, floor((v * mult + 2^30) / 2^31) is the
         * high word of 2v * mult + 2^31 (SMMULR's form), |h| < 2^30, and rounding right by e >= 1 with halves away
         * from zero is adding 2^(e-1), less 1 for a negative h, then shifting (no overflow at that size). */
        h = (int32_t)(((int64_t)(v * 2) * mult + ((int64_t)1 << 31)) >> 32);
        return (h + (1 << (-shift - 1)) - (int32_t)((uint32_t)h >> 31)) >> -shift;
    }
    if (shift > 0) { /* saturating left shift: |v| * 2^shift beyond int32 sticks at its end */
        const int32_t lim = INT32_MAX >> shift;
        v = v > lim ? INT32_MAX : v < -lim - 1 ? INT32_MIN : (int32_t)((uint32_t)v << shift);
    }
    /* >> of a negative int64 is arithmetic on every compiler this runtime supports (gcc documents it) */
    h = (int32_t)(((int64_t)v * mult + ((int64_t)1 << 30)) >> 31);
    return shift < 0 ? et_q8_rounding_rshift(h, (int)-shift) : h;
}

/* An accumulator of output channel c as the int8 output. */
static inline int8_t et_q8_output(const et_q8_requant *q, int c, int32_t acc)
{
    int32_t v = et_q8_requantize(acc, q->mult[c], q->shift[c]) + q->out_zp;
    v = v < q->act_min ? q->act_min : v;
    return (int8_t)(v > q->act_max ? q->act_max : v);
}

static inline int8_t et_q8_sat8(int32_t v)
{
    return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
}

/* v rounded to the nearest integer, halves to even, for |v| < 2^23 (callers hold it there): truncation toward zero
 * and the remainder are exact at that size, so no libm or FPU rounding mode is involved. numpy's rint, bit for bit. */
static inline int32_t et_q8_round_even(float v)
{
    int32_t i = (int32_t)v;
    float frac = v - (float)i;
    if (frac > 0.5f || (frac == 0.5f && (i & 1)))
        ++i;
    else if (frac < -0.5f || (frac == -0.5f && (i & 1)))
        --i;
    return i;
}

/* -- packed helpers: two signed 16-bit halves in one uint32 ------------------------------------------- */

/* The low and the high half, signed (a product of one with a 16-bit value compiles to SMULBB / SMULTB). */
static inline int32_t et_q8_lo(uint32_t v)
{
    return (int32_t)(int16_t)(v & 0xFFFFu);
}

static inline int32_t et_q8_hi(uint32_t v)
{
    return (int32_t)(int16_t)(v >> 16);
}

/* Four int8 from any address (an unaligned LDR on the M4/M7; memcpy keeps it legal C). */
static inline uint32_t et_q8_load4(const int8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if ET_Q8_DSP
/* bytes 0 and 2 sign-extended to halves, plus the halves of `off` (SXTAB16 / SXTB16) */
#define et_q8_sxtab16(off, v) ((uint32_t)__sxtab16((off), (v)))
#define et_q8_sxtb16(v) ((uint32_t)__sxtb16(v))
/* acc + lo(a)*lo(b) + hi(a)*hi(b) (SMLAD); acc + lo(a)*lo(b) (SMLABB) */
#define et_q8_smlad(a, b, acc) ((int32_t)__smlad((a), (b), (acc)))
#define et_q8_smlabb(a, b, acc) ((int32_t)__smlabb((int32_t)(a), (int32_t)(b), (acc)))

/* bytes 1 and 3: the instruction's own rotation (gcc does not fold a separate ROR into the intrinsic) */
static inline uint32_t et_q8_sxtb16_ror8(uint32_t v)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}

static inline uint32_t et_q8_sxtab16_ror8(uint32_t off, uint32_t v)
{
    uint32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(off), "r"(v));
    return r;
}
#else
static inline uint32_t et_q8_half(int32_t v)
{
    return (uint32_t)v & 0xFFFFu;
}

static inline uint32_t et_q8_sxtab16(uint32_t off, uint32_t v)
{
    return et_q8_half(et_q8_lo(off) + (int8_t)(v & 0xFFu)) | et_q8_half(et_q8_hi(off) + (int8_t)((v >> 16) & 0xFFu)) << 16;
}

static inline uint32_t et_q8_sxtb16(uint32_t v)
{
    return et_q8_sxtab16(0u, v);
}

static inline int32_t et_q8_smlad(uint32_t a, uint32_t b, int32_t acc)
{
    return (int32_t)((uint32_t)acc + (uint32_t)(et_q8_lo(a) * et_q8_lo(b)) + (uint32_t)(et_q8_hi(a) * et_q8_hi(b)));
}

static inline int32_t et_q8_smlabb(uint32_t a, uint32_t b, int32_t acc)
{
    return (int32_t)((uint32_t)acc + (uint32_t)(et_q8_lo(a) * et_q8_lo(b)));
}

static inline uint32_t et_q8_sxtb16_ror8(uint32_t v)
{
    return et_q8_sxtb16((v >> 8) | (v << 24));
}

static inline uint32_t et_q8_sxtab16_ror8(uint32_t off, uint32_t v)
{
    return et_q8_sxtab16(off, (v >> 8) | (v << 24));
}
#endif

/* (lo(a), lo(b)) and (hi(a), hi(b)): the halves of two registers regrouped (PKHBT / PKHTB; gcc 12 makes two
 * instructions of the C expression, so the DSP build names the instruction). */
#if ET_Q8_DSP
static inline uint32_t et_q8_pack_lo(uint32_t a, uint32_t b)
{
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

static inline uint32_t et_q8_pack_hi(uint32_t a, uint32_t b)
{
    uint32_t r;
    __asm__("pkhtb %0, %2, %1, asr #16" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#else
static inline uint32_t et_q8_pack_lo(uint32_t a, uint32_t b)
{
    return (a & 0xFFFFu) | (b << 16);
}

static inline uint32_t et_q8_pack_hi(uint32_t a, uint32_t b)
{
    return (a >> 16) | (b & 0xFFFF0000u);
}
#endif

/* An offset in both halves, for SXTAB16. */
static inline uint32_t et_q8_dup16(int32_t v)
{
    return ((uint32_t)v & 0xFFFFu) * 0x00010001u;
}

#if ET_Q8_FAST
/* acc[r] += sum_i (a[i] + a_off) * b_r[i] over i < len, for four rows b_r: a's four bytes are unpacked
 * once per step and shared by the rows (SXTAB16 takes the even bytes, the rotated word the odd ones;
 * each SMLAD then adds two of the four products). */
static inline void et_q8_dot4_rows(const int8_t *a, int32_t a_off, const int8_t *b0, const int8_t *b1,
                                   const int8_t *b2, const int8_t *b3, int len, int32_t acc[4])
{
    const uint32_t off = et_q8_dup16(a_off);
    int32_t s0 = acc[0], s1 = acc[1], s2 = acc[2], s3 = acc[3];
    int i;

    for (i = 0; i + 4 <= len; i += 4) {
        const uint32_t va = et_q8_load4(a + i);
        const uint32_t ae = et_q8_sxtab16(off, va), ao = et_q8_sxtab16_ror8(off, va);
        uint32_t v = et_q8_load4(b0 + i);
        s0 = et_q8_smlad(ae, et_q8_sxtb16(v), s0);
        s0 = et_q8_smlad(ao, et_q8_sxtb16_ror8(v), s0);
        v = et_q8_load4(b1 + i);
        s1 = et_q8_smlad(ae, et_q8_sxtb16(v), s1);
        s1 = et_q8_smlad(ao, et_q8_sxtb16_ror8(v), s1);
        v = et_q8_load4(b2 + i);
        s2 = et_q8_smlad(ae, et_q8_sxtb16(v), s2);
        s2 = et_q8_smlad(ao, et_q8_sxtb16_ror8(v), s2);
        v = et_q8_load4(b3 + i);
        s3 = et_q8_smlad(ae, et_q8_sxtb16(v), s3);
        s3 = et_q8_smlad(ao, et_q8_sxtb16_ror8(v), s3);
    }
    for (; i < len; ++i) {
        const int32_t x = a[i] + a_off;
        s0 += x * b0[i];
        s1 += x * b1[i];
        s2 += x * b2[i];
        s3 += x * b3[i];
    }
    acc[0] = s0;
    acc[1] = s1;
    acc[2] = s2;
    acc[3] = s3;
}

/* sum_i (a[i] + a_off) * b[i] over i < len, two products per SMLAD. */
static inline int32_t et_q8_dot(const int8_t *a, int32_t a_off, const int8_t *b, int len, int32_t acc)
{
    const uint32_t off = et_q8_dup16(a_off);
    int i;

    for (i = 0; i + 4 <= len; i += 4) {
        const uint32_t va = et_q8_load4(a + i), vb = et_q8_load4(b + i);
        acc = et_q8_smlad(et_q8_sxtab16(off, va), et_q8_sxtb16(vb), acc);
        acc = et_q8_smlad(et_q8_sxtab16_ror8(off, va), et_q8_sxtb16_ror8(vb), acc);
    }
    for (; i < len; ++i)
        acc += (a[i] + a_off) * b[i];
    return acc;
}

/* acc[j] += sum_r g[r] * w[r * w_stride + j] for j < 4 and r < rows: a column sum of a row-major int8
 * matrix (a transposed product). Rows go in pairs: the pair's two words are split into even and odd
 * bytes and regrouped so each register holds (w[r][j], w[r+1][j]), which SMLAD multiplies by
 * (g[r], g[r+1]). */
static inline void et_q8_colsum4(const int8_t *g, const int8_t *w, int w_stride, int rows, int32_t acc[4])
{
    int32_t s0 = acc[0], s1 = acc[1], s2 = acc[2], s3 = acc[3];
    int r;

    for (r = 0; r + 2 <= rows; r += 2) {
        const uint32_t gp = et_q8_pack_lo((uint32_t)(int32_t)g[r], (uint32_t)(int32_t)g[r + 1]);
        const uint32_t v0 = et_q8_load4(w + (long)r * w_stride), v1 = et_q8_load4(w + (long)(r + 1) * w_stride);
        const uint32_t e0 = et_q8_sxtb16(v0), e1 = et_q8_sxtb16(v1);
        const uint32_t o0 = et_q8_sxtb16_ror8(v0), o1 = et_q8_sxtb16_ror8(v1);
        s0 = et_q8_smlad(et_q8_pack_lo(e0, e1), gp, s0);
        s1 = et_q8_smlad(et_q8_pack_lo(o0, o1), gp, s1);
        s2 = et_q8_smlad(et_q8_pack_hi(e0, e1), gp, s2);
        s3 = et_q8_smlad(et_q8_pack_hi(o0, o1), gp, s3);
    }
    for (; r < rows; ++r) {
        const int8_t *wr = w + (long)r * w_stride;
        s0 += g[r] * wr[0];
        s1 += g[r] * wr[1];
        s2 += g[r] * wr[2];
        s3 += g[r] * wr[3];
    }
    acc[0] = s0;
    acc[1] = s1;
    acc[2] = s2;
    acc[3] = s3;
}

/* Where element j of a window of `len` sits in an int16 column: each whole quad is stored (0, 2, 1, 3), so a
 * word of the column holds the elements an SXTB16 of four weights gives (0 and 2, then 1 and 3); the
 * elements past the last quad stay in order. */
static inline int et_q8_col_pos(int j, int len)
{
    return j < (len & ~3) ? (j & ~3) | ((j & 1) << 1) | ((j >> 1) & 1) : j;
}

static inline uint32_t et_q8_load2x16(const int16_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* acc[2r + c] += sum_i w_r[i] * col_c[i] for weight rows w_0, w_1 (int8) and columns col_0, col_1 (int16,
 * quads stored by et_q8_col_pos): per quad, two weight words unpacked once and four column words loaded
 * once serve eight SMLADs (sixteen multiply-adds). */
static inline void et_q8_mac_2x2(const int16_t *c0, const int16_t *c1, const int8_t *w0, const int8_t *w1, int len,
                                 int32_t acc[4])
{
    int32_t s00 = acc[0], s01 = acc[1], s10 = acc[2], s11 = acc[3];
    int i;

    for (i = 0; i + 4 <= len; i += 4) {
        const uint32_t a = et_q8_load4(w0 + i), b = et_q8_load4(w1 + i);
        const uint32_t ae = et_q8_sxtb16(a), ao = et_q8_sxtb16_ror8(a), be = et_q8_sxtb16(b), bo = et_q8_sxtb16_ror8(b);
        const uint32_t x0e = et_q8_load2x16(c0 + i), x0o = et_q8_load2x16(c0 + i + 2);
        const uint32_t x1e = et_q8_load2x16(c1 + i), x1o = et_q8_load2x16(c1 + i + 2);
        s00 = et_q8_smlad(ae, x0e, s00);
        s00 = et_q8_smlad(ao, x0o, s00);
        s01 = et_q8_smlad(ae, x1e, s01);
        s01 = et_q8_smlad(ao, x1o, s01);
        s10 = et_q8_smlad(be, x0e, s10);
        s10 = et_q8_smlad(bo, x0o, s10);
        s11 = et_q8_smlad(be, x1e, s11);
        s11 = et_q8_smlad(bo, x1o, s11);
    }
    for (; i < len; ++i) {
        s00 += w0[i] * c0[i];
        s01 += w0[i] * c1[i];
        s10 += w1[i] * c0[i];
        s11 += w1[i] * c1[i];
    }
    acc[0] = s00;
    acc[1] = s01;
    acc[2] = s10;
    acc[3] = s11;
}

/* acc + (x[0] + off) * w0 + (x[1] + off) * w1 + (x[2] + off) * w2, with w02 = (w0, w2) packed and `off` in both
 * halves: one 3-tap kernel row in an SMLAD and an SMLABB. Reads x[3] too (unused): the caller keeps it inside the
 * tensor. */
static inline int32_t et_q8_row3(const int8_t *x, uint32_t off, uint32_t w02, int32_t w1, int32_t acc)
{
    const uint32_t v = et_q8_load4(x);
    acc = et_q8_smlad(et_q8_sxtab16(off, v), w02, acc);
    return et_q8_smlabb(et_q8_sxtab16_ror8(off, v), (uint32_t)w1, acc);
}
#endif /* ET_Q8_FAST */

#if ET_Q8_FAST
/* Four int8 lanes: lane-wise max and min, and g's lanes kept where y > lo (or y < hi), else 0 (SSUB8
 * sets a GE flag per lane where the difference is >= 0, SEL picks by the flags). */
#if ET_Q8_DSP
static inline uint32_t et_q8_max4(uint32_t a, uint32_t b)
{
    (void)__ssub8(a, b);
    return __sel(a, b);
}

static inline uint32_t et_q8_min4(uint32_t a, uint32_t b)
{
    (void)__ssub8(a, b);
    return __sel(b, a);
}

static inline uint32_t et_q8_keep_gt4(uint32_t g, uint32_t y, uint32_t lo)
{
    (void)__ssub8(lo, y);
    return __sel(0u, g);
}

static inline uint32_t et_q8_keep_lt4(uint32_t g, uint32_t y, uint32_t hi)
{
    (void)__ssub8(y, hi);
    return __sel(0u, g);
}
#else
static inline int32_t et_q8_lane(uint32_t v, int i)
{
    return (int8_t)((v >> (8 * i)) & 0xFFu);
}

static inline uint32_t et_q8_lanewise(uint32_t a, uint32_t b, uint32_t g, int op)
{
    uint32_t r = 0u;
    int i;

    for (i = 0; i < 4; ++i) {
        const int32_t x = et_q8_lane(a, i), y = et_q8_lane(b, i);
        const int32_t v = op == 0 ? (x > y ? x : y) : op == 1 ? (x < y ? x : y) : op == 2 ? (x > y ? et_q8_lane(g, i) : 0)
                                                                                          : (x < y ? et_q8_lane(g, i) : 0);
        r |= ((uint32_t)v & 0xFFu) << (8 * i);
    }
    return r;
}

static inline uint32_t et_q8_max4(uint32_t a, uint32_t b) { return et_q8_lanewise(a, b, 0u, 0); }
static inline uint32_t et_q8_min4(uint32_t a, uint32_t b) { return et_q8_lanewise(a, b, 0u, 1); }
static inline uint32_t et_q8_keep_gt4(uint32_t g, uint32_t y, uint32_t lo) { return et_q8_lanewise(y, lo, g, 2); }
static inline uint32_t et_q8_keep_lt4(uint32_t g, uint32_t y, uint32_t hi) { return et_q8_lanewise(y, hi, g, 3); }
#endif

/* v in all four lanes */
static inline uint32_t et_q8_dup8(int32_t v)
{
    return ((uint32_t)v & 0xFFu) * 0x01010101u;
}

static inline void et_q8_store4(int8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
#endif /* ET_Q8_FAST */

#endif /* ET_Q8_ARITH_H */
