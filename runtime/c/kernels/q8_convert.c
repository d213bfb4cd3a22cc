#include "q8_convert.h"

/* round(v) + zp saturated to int8, v rounded to the nearest integer with halves to even. |v| is first held
 * within 1024 (any larger value saturates anyway), where truncation toward zero and the remainder are exact. */
static int8_t et_q8_round_to(float v, int32_t zp)
{
    int32_t i, q;
    float frac;

    if (v > 1024.0f)
        v = 1024.0f;
    else if (v < -1024.0f)
        v = -1024.0f;
    else if (v != v)
        v = 0.0f; /* NaN: no integer is right; 0 keeps the output defined */
    i = (int32_t)v;
    frac = v - (float)i;
    if (frac > 0.5f || (frac == 0.5f && (i & 1)))
        ++i;
    else if (frac < -0.5f || (frac == -0.5f && (i & 1)))
        --i;
    q = i + zp;
    return (int8_t)(q > 127 ? 127 : q < -128 ? -128 : q);
}

void et_q8_quantize(int count, const float *x, float scale, int32_t zp, int8_t *y)
{
    int i;
    for (i = 0; i < count; ++i)
        y[i] = et_q8_round_to(x[i] / scale, zp);
}

void et_q8_dequantize(int count, const int8_t *x, float scale, int32_t zp, float *y)
{
    int i;
    for (i = 0; i < count; ++i)
        y[i] = scale * (float)((int32_t)x[i] - zp);
}

void et_q8_add(int count, const int8_t *a, float a_scale, int32_t a_zp, const int8_t *b, float b_scale,
               int32_t b_zp, float scale, int32_t zp, int8_t *y)
{
    int i;
    for (i = 0; i < count; ++i) {
        const float va = a_scale * (float)((int32_t)a[i] - a_zp);
        const float vb = b_scale * (float)((int32_t)b[i] - b_zp);
        y[i] = et_q8_round_to((va + vb) / scale, zp);
    }
}
