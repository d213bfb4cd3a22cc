/* silu.c - see silu.h. */
#include "silu.h"

#include "../et_math.h"

void et_silu_forward(int count, const float *x, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = x[i] / (1.0f + et_expf(-x[i]));
}

void et_silu_backward(int count, const float *gy, const float *x, float *gx)
{
    int i;

    for (i = 0; i < count; ++i) {
        const float v = x[i];
        const float s = 1.0f / (1.0f + et_expf(-v));
        gx[i] = gy[i] * s * (1.0f + v * (1.0f - s));
    }
}
