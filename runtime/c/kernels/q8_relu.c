/* q8_relu.c - see q8_relu.h. */
#include "q8_relu.h"

#include "q8_arith.h"

void et_q8_relu_forward_ref(int count, const int8_t *x, int32_t zp, int8_t *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = (int8_t)(x[i] < zp ? zp : x[i]);
}

void et_q8_relu_backward_ref(int count, const int8_t *gy, const int8_t *y, int32_t zp, int8_t *gx)
{
    int i;

    for (i = 0; i < count; ++i)
        gx[i] = y[i] > zp ? gy[i] : 0;
}

#if ET_Q8_FAST
void et_q8_relu_forward(int count, const int8_t *x, int32_t zp, int8_t *y)
{
    const uint32_t z = et_q8_dup8(zp);
    int i;

    for (i = 0; i + 4 <= count; i += 4)
        et_q8_store4(y + i, et_q8_max4(et_q8_load4(x + i), z));
    et_q8_relu_forward_ref(count - i, x + i, zp, y + i);
}

void et_q8_relu_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int8_t *gx)
{
    const uint32_t z = et_q8_dup8(zp);
    int i;

    for (i = 0; i + 4 <= count; i += 4)
        et_q8_store4(gx + i, et_q8_keep_gt4(et_q8_load4(gy + i), et_q8_load4(y + i), z));
    et_q8_relu_backward_ref(count - i, gy + i, y + i, zp, gx + i);
}
#else
void et_q8_relu_forward(int count, const int8_t *x, int32_t zp, int8_t *y)
{
    et_q8_relu_forward_ref(count, x, zp, y);
}

void et_q8_relu_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int8_t *gx)
{
    et_q8_relu_backward_ref(count, gy, y, zp, gx);
}
#endif
