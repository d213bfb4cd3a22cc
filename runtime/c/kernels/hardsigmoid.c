/* hardsigmoid.c - see hardsigmoid.h. */
#include "hardsigmoid.h"

void et_hardsigmoid_forward(int count, const float *x, float *y)
{
    int i;

    for (i = 0; i < count; ++i) {
        float t = x[i] + 3.0f;
        /* Comparisons that are false for NaN, so a NaN passes through (torch's vector min/max propagate it). */
        t = t < 0.0f ? 0.0f : t;
        t = t > 6.0f ? 6.0f : t;
        y[i] = t / 6.0f;
    }
}

void et_hardsigmoid_backward(int count, const float *gy, const float *x, float *gx)
{
    const float one_sixth = 1.0f / 6.0f;
    int i;

    for (i = 0; i < count; ++i)
        gx[i] = (x[i] > -3.0f && x[i] < 3.0f) ? gy[i] * one_sixth : 0.0f;
}
