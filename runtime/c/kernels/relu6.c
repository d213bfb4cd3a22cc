/* relu6.c - see relu6.h. */
#include "relu6.h"

void et_relu6_forward(int count, const float *x, float *y)
{
    int i;

    /* Comparisons that are false for NaN, so a NaN passes through as in torch's clamp. */
    for (i = 0; i < count; ++i)
        y[i] = x[i] < 0.0f ? 0.0f : (x[i] > 6.0f ? 6.0f : x[i]);
}

void et_relu6_backward(int count, const float *gy, const float *y, float *gx)
{
    int i;

    /* hardtanh_backward: no gradient at or beyond either bound. */
    for (i = 0; i < count; ++i)
        gx[i] = (y[i] <= 0.0f || y[i] >= 6.0f) ? 0.0f : gy[i];
}
