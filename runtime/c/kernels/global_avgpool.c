/*
 * global_avgpool.c - see global_avgpool.h.
 *
 * The sum is sequential; torch's sum kernel uses several vector accumulators, so the forward agrees with
 * it to float32 rounding. Both divide by hw (not multiply by 1/hw); the backward matches exactly.
 */
#include "global_avgpool.h"

void et_global_avgpool_forward(int n, int c, int hw, const float *x, float *y)
{
    long p;
    int i;

    for (p = 0; p < (long)n * c; ++p) {
        const float *xp = x + p * hw;
        float sum = 0.0f;
        for (i = 0; i < hw; ++i)
            sum += xp[i];
        y[p] = sum / (float)hw;
    }
}

void et_global_avgpool_backward(int n, int c, int hw, const float *gy, float *gx)
{
    long p;
    int i;

    for (p = 0; p < (long)n * c; ++p) {
        const float g = gy[p] / (float)hw;
        for (i = 0; i < hw; ++i)
            gx[p * hw + i] = g;
    }
}
