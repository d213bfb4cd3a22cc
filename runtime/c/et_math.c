/*
 * et_math.c - exp, log, tanh and erf in float32 with basic operations (and the correctly rounded fmaf)
 * only (see et_math.h for why).
 *
 * Both follow the classic fdlibm/FreeBSD method (Sun Microsystems' argument reductions and minimax
 * polynomials, the reference float implementations): reduce the argument with a constant split into a
 * high part with trailing zero bits (so k*hi is exact) and a low part, evaluate a short polynomial on the
 * small remainder, scale by a power of two built from its bits.
 */
#include "et_math.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u); /* memcpy, not a pointer cast: no strict-aliasing trouble */
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 2^k for a normal exponent, -126 <= k <= 127. */
static float pow2i(int k)
{
    return float_of((uint32_t)(k + 127) << 23);
}

float et_expf(float x)
{
    /* ln2 = LN2_HI + LN2_LO; LN2_HI has 9 trailing zero bits, so k * LN2_HI is exact for |k| < 512. */
    const float LN2_HI = 0x1.62e400p-1f;   /* 6.9314575195e-01 */
    const float LN2_LO = 0x1.7f7d1cp-20f;  /* 1.4286067653e-06 */
    const float INV_LN2 = 0x1.715476p+0f;  /* 1.4426950216e+00 */
    /* Minimax coefficients of R(r^2) in e^r = 1 + 2r/(R - r), |r| <= ln2/2 (error < 2^-27). */
    const float P1 = 0x1.55551ep-3f;       /* 1.6666625440e-01 */
    const float P2 = -0x1.6aa42ap-9f;      /* -2.7667332906e-03 */
    float hi, lo, r, t, c, y;
    int k;

    if (x != x)
        return x + x; /* NaN */
    if (x > 0x1.62e42ep+6f)        /* > 88.7228..., ln(FLT_MAX): overflow */
        return float_of(0x7f800000u);
    if (x < -0x1.9fe368p+6f)       /* < -103.9720..., below half the smallest subnormal: underflow */
        return 0.0f;
    if (x > -0x1p-14f && x < 0x1p-14f)
        return 1.0f + x;           /* e^x = 1 + x + x^2/2 and x^2/2 < ulp(1)/2: correctly rounded */

    /* x = k*ln2 + r, |r| <= ln2/2; round k to nearest (the cast truncates toward zero). */
    k = (int)(INV_LN2 * x + (x < 0.0f ? -0.5f : 0.5f));
    hi = x - (float)k * LN2_HI;    /* exact */
    lo = (float)k * LN2_LO;
    r = hi - lo;

    /* e^r = 1 + r + r*c/(2-c) with c = r - r^2*R(r^2); written as in fdlibm to keep the rounding small. */
    t = r * r;
    c = r - t * (P1 + t * P2);
    y = 1.0f - ((lo - (r * c) / (2.0f - c)) - hi);

    /* y * 2^k without overflowing the scale factor at either end of the range. */
    if (k > 127)
        return y * 2.0f * pow2i(127);
    if (k >= -126)
        return y * pow2i(k);
    return (y * pow2i(k + 100)) * pow2i(-100); /* result is subnormal: one rounding, at the last multiply */
}

float et_logf(float x)
{
    /* ln2 = LN2_HI + LN2_LO; LN2_HI has 11 trailing zero bits, so k * LN2_HI is exact. */
    const float LN2_HI = 0x1.62e300p-1f;   /* 6.9313812256e-01 */
    const float LN2_LO = 0x1.2fefa2p-17f;  /* 9.0580006145e-06 */
    /* Minimax coefficients of log(1+f) = 2s + s*R(s^2), s = f/(2+f), on [sqrt(2)/2 - 1, sqrt(2) - 1]. */
    const float LG1 = 0x1.555554p-1f;     /* 0.66666662693 */
    const float LG2 = 0x1.999c26p-2f;     /* 0.40000972152 */
    const float LG3 = 0x1.23d3dcp-2f;     /* 0.28498786688 */
    const float LG4 = 0x1.f13c4cp-3f;     /* 0.24279078841 */
    uint32_t ix;
    int k = 0;
    float f, s, z, w, R, hfsq, dk;

    if (x != x)
        return x + x;                       /* NaN */
    if (x < 0.0f)
        return float_of(0x7fc00000u);       /* log of a negative number: NaN */
    if (x == 0.0f)
        return -float_of(0x7f800000u);      /* -inf */
    ix = bits_of(x);
    if (ix >= 0x7f800000u)
        return x;                           /* +inf */
    if (ix < 0x00800000u) {                 /* subnormal: scale into the normal range first */
        x *= 0x1p25f;
        k = -25;
        ix = bits_of(x);
    }

    /* x = 2^k * m, with m in [sqrt(2)/2, sqrt(2)) so that f = m - 1 is small and exact. */
    k += (int)(ix >> 23) - 127;
    ix &= 0x007fffffu;
    if (ix > 0x3504f3u) {                   /* mantissa above sqrt(2): use m/2 and k+1 */
        ix |= 0x3f000000u;
        k += 1;
    } else {
        ix |= 0x3f800000u;
    }
    f = float_of(ix) - 1.0f;

    s = f / (2.0f + f);
    z = s * s;
    w = z * z;
    R = z * (LG1 + w * LG3) + w * (LG2 + w * LG4);
    hfsq = 0.5f * f * f;
    dk = (float)k;
    /* log(m) = f - hfsq + s*(hfsq + R); add k*ln2 with the small parts first. */
    return dk * LN2_HI - ((hfsq - (s * (hfsq + R) + dk * LN2_LO)) - f);
}

float et_tanhf(float x)
{
    const float a = x < 0.0f ? -x : x;
    float t, y;

    if (x != x)
        return x + x; /* NaN */
    if (a < 0.25f) {
        /* Odd Taylor series to x^13, x + x^3 * P(x^2): the next term is below 2^-30 of the result here. */
        const float z = x * x;
        y = 0x1.d6d3d0p-9f;                    /* 21844/6081075 */
        y = y * z - 0x1.226e36p-7f;            /* 1382/155925 */
        y = y * z + 0x1.664f48p-6f;            /* 62/2835 */
        y = y * z - 0x1.ba1ba2p-5f;            /* 17/315 */
        y = y * z + 0x1.111112p-3f;            /* 2/15 */
        y = y * z - 0x1.555556p-2f;            /* 1/3 */
        return x + x * z * y;
    }
    if (a > 9.0f)
        return x < 0.0f ? -1.0f : 1.0f; /* 1 - tanh(9) < 2^-25: rounds to 1 */
    /* tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|); for |x| >= 1/4 the subtraction loses under 2 bits. */
    t = et_expf(-2.0f * a);
    y = (1.0f - t) / (1.0f + t);
    return x < 0.0f ? -y : y;
}

#define ERF_SERIES_TO 1.0f
#define ERF_CF_FROM 2.0f
#define ERF_CF_DEPTH 40

float et_erff(float x)
{
    const float TWO_OVER_SQRTPI = 0x1.20dd76p+0f; /* 2/sqrt(pi) */
    const float a = x < 0.0f ? -x : x;
    float z, y, term, sum, hi, lo, e;
    int n;

    if (x != x)
        return x + x; /* NaN */
    if (a >= 4.0f)
        return x < 0.0f ? -1.0f : 1.0f; /* 1 - erf(4) < 2^-25: rounds to 1 */
    z = x * x;
    if (a < ERF_SERIES_TO) {
        /* Maclaurin series 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), to a term under 2^-30. */
        sum = 0.0f;
        term = 1.0f; /* (-z)^n / n! */
        for (n = 0; n < 48 && (term > 0x1p-30f || term < -0x1p-30f); ++n) {
            sum += term / (float)(2 * n + 1);
            term = term * -z / (float)(n + 1);
        }
        return TWO_OVER_SQRTPI * (x * sum);
    }
    /* e^(-a^2) from a^2 = hi + lo exactly (fmaf): e^-hi * (1 - lo), since |lo| <= 2^-20. */
    hi = z;
    lo = fmaf(a, a, -hi);
    e = et_expf(-hi) * (1.0f - lo);
    if (a >= ERF_CF_FROM) {
        /* erf = 1 - erfc, erfc(a) = e^(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))),
         * Laplace's continued fraction, evaluated from a fixed depth up: erfc < 0.005 here, so its relative
         * error need only be ~1e-5 for erf to be right to an ulp. */
        sum = a;
        for (n = ERF_CF_DEPTH; n >= 1; --n)
            sum = a + (0.5f * (float)n) / sum;
        y = 1.0f - (0.5f * TWO_OVER_SQRTPI) * e / sum;
    } else {
        /* erf(a) = 2/sqrt(pi) * e^(-a^2) * sum a^(2n+1) 2^n / (2n+1)!!: all terms positive, no cancellation. */
        term = a;
        sum = a;
        for (n = 1; n < 64 && term > sum * 0x1p-26f; ++n) {
            term = term * (2.0f * z) / (float)(2 * n + 1);
            sum += term;
        }
        y = TWO_OVER_SQRTPI * (e * sum);
    }
    y = y > 1.0f ? 1.0f : y;
    return x < 0.0f ? -y : y;
}
