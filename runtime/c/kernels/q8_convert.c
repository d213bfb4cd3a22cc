#include "q8_convert.h"
#include "q8_arith.h"

/* round(v) + zp saturated to int8, v rounded to the nearest integer with halves to even. |v| is first held
 * within 1024 (any larger value saturates anyway), where truncation toward zero and the remainder are exact. */
static int8_t et_q8_round_to(float v, int32_t zp)
{
    if (v > 1024.0f)
        v = 1024.0f;
    else if (v < -1024.0f)
        v = -1024.0f;
    else if (v != v)
        v = 0.0f; /* NaN: no integer is right; 0 keeps the output defined */
    return et_q8_sat8(et_q8_round_even(v) + zp);
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
