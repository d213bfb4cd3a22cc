/* q8_relu6.c - see q8_relu6.h. */
#include "q8_relu6.h"

#include "q8_arith.h"

void et_q8_relu6_forward_ref(int count, const int8_t *x, int32_t zp, int32_t q6, int8_t *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = (int8_t)(x[i] < zp ? zp : x[i] > q6 ? q6 : x[i]);
}

void et_q8_relu6_backward_ref(int count, const int8_t *gy, const int8_t *y, int32_t zp, int32_t q6, int8_t *gx)
{
    int i;

    for (i = 0; i < count; ++i)
        gx[i] = y[i] > zp && y[i] < q6 ? gy[i] : 0;
}

#if ET_Q8_FAST
void et_q8_relu6_forward(int count, const int8_t *x, int32_t zp, int32_t q6, int8_t *y)
{
    const uint32_t lo = et_q8_dup8(zp), hi = et_q8_dup8(q6);
    int i;

    for (i = 0; i + 4 <= count; i += 4)
        et_q8_store4(y + i, et_q8_min4(et_q8_max4(et_q8_load4(x + i), lo), hi));
    et_q8_relu6_forward_ref(count - i, x + i, zp, q6, y + i);
}

void et_q8_relu6_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int32_t q6, int8_t *gx)
{
    const uint32_t lo = et_q8_dup8(zp), hi = et_q8_dup8(q6);
    int i;

    for (i = 0; i + 4 <= count; i += 4) {
        const uint32_t v = et_q8_load4(y + i);
        et_q8_store4(gx + i, et_q8_keep_lt4(et_q8_keep_gt4(et_q8_load4(gy + i), v, lo), v, hi));
    }
    et_q8_relu6_backward_ref(count - i, gy + i, y + i, zp, q6, gx + i);
}
#else
void et_q8_relu6_forward(int count, const int8_t *x, int32_t zp, int32_t q6, int8_t *y)
{
    et_q8_relu6_forward_ref(count, x, zp, q6, y);
}

void et_q8_relu6_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int32_t q6, int8_t *gx)
{
    et_q8_relu6_backward_ref(count, gy, y, zp, q6, gx);
}
#endif
