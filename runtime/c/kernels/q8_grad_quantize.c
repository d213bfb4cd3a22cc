/* q8_grad_quantize.c - see q8_grad_quantize.h. */
#include "q8_grad_quantize.h"
#include "q8_arith.h"

/* round(v) with halves to even for |v| <= 127.5 (the quotient by the largest magnitude's scale), within +-127;
 * truncation toward zero and the remainder are exact at that size, so no libm or FPU mode is involved. */
static int8_t round_within_127(float v)
{
    int32_t i;

    if (v > 127.0f)
        return 127;
    if (v < -127.0f)
        return -127;
    i = et_q8_round_even(v);
    return (int8_t)(i > 127 ? 127 : i < -127 ? -127 : i);
}

float et_q8_grad_quantize(int count, const float *g, int8_t *q)
{
    float amax = 0.0f, s;
    int i, finite = 1;

    for (i = 0; i < count; ++i) {
        const float a = g[i] < 0.0f ? -g[i] : g[i];
        if (a != a || a > 3.40282347e38f)
            finite = 0;
        else if (a > amax)
            amax = a;
    }
    if (!finite || !(amax > 0.0f)) {
        for (i = 0; i < count; ++i)
            q[i] = 0;
        return 0.0f;
    }
    s = amax / 127.0f;
    for (i = 0; i < count; ++i)
        q[i] = round_within_127(g[i] / s);
    return s;
}

float et_q8_sums_quantize(int count, const int32_t *acc, float unit, int8_t *q)
{
    int64_t m = 0;
    int i;

    for (i = 0; i < count; ++i) {
        const int64_t a = acc[i] < 0 ? -(int64_t)acc[i] : (int64_t)acc[i];
        if (a > m)
            m = a;
    }
    if (m == 0) {
        for (i = 0; i < count; ++i)
            q[i] = 0;
        return 0.0f;
    }
    for (i = 0; i < count; ++i) {
        const int64_t a = acc[i] < 0 ? -(int64_t)acc[i] : (int64_t)acc[i];
        const int32_t v = (int32_t)((2 * 127 * a + m) / (2 * m));
        q[i] = (int8_t)(acc[i] < 0 ? -v : v);
    }
    return unit * (float)m / 127.0f;
}
