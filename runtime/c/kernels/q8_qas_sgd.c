/* q8_qas_sgd.c - see q8_qas_sgd.h. */
#include "q8_qas_sgd.h"
#include "q8_arith.h"

/* round(v) with halves to even, saturated to int32, without libm: floats of magnitude 2^23 and more are integers
 * already; below it truncation toward zero and the remainder are exact. NaN gives 0. */
static int64_t round_even_sat32(float v)
{
    if (v != v)
        return 0;
    if (v >= 2147483648.0f)
        return INT32_MAX;
    if (v <= -2147483648.0f)
        return INT32_MIN;
    if (v >= 8388608.0f || v <= -8388608.0f)
        return (int64_t)v;
    return et_q8_round_even(v);
}

void et_q8_qas_sgd(int channels, const int32_t *gb, float s_g, const float *s_b, float lr, float momentum,
                   float weight_decay, int32_t *b, float *m)
{
    int c;

    for (c = 0; c < channels; ++c) {
        float g = s_g * (float)gb[c], d;
        int64_t v;
        if (weight_decay != 0.0f)
            g = g + weight_decay * (s_b[c] * (float)b[c]);
        if (momentum != 0.0f) {
            m[c] = momentum * m[c] + g;
            d = m[c];
        } else {
            d = g;
        }
        v = (int64_t)b[c] - round_even_sat32((lr * d) / s_b[c]);
        b[c] = (int32_t)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v);
    }
}
