/* mul.c - see mul.h. */
#include "mul.h"

void et_mul_forward(int count, const float *a, const float *b, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = a[i] * b[i];
}

void et_mul_bcast_forward(int planes, int hw, const float *x, const float *s, float *y)
{
    long p;
    int i;

    for (p = 0; p < planes; ++p) {
        const float k = s[p];
        for (i = 0; i < hw; ++i)
            y[p * hw + i] = x[p * hw + i] * k;
    }
}

void et_mul_bcast_backward_scale(int planes, int hw, const float *gy, const float *x, float *gs)
{
    long p;
    int i;

    for (p = 0; p < planes; ++p) {
        float sum = 0.0f;
        /* Each product rounded before it is added (no fmaf): the value of mul then sum. */
        for (i = 0; i < hw; ++i)
            sum += gy[p * hw + i] * x[p * hw + i];
        gs[p] = sum;
    }
}
