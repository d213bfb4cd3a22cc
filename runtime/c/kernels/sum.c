/*
 * sum.c - see sum.h.
 */
#include "sum.h"

void et_sum_planes(int planes, int hw, const float *x, float *y)
{
    int p, i;

    for (p = 0; p < planes; ++p) {
        const float *xp = x + (long)p * hw;
        float acc = 0.0f;
        for (i = 0; i < hw; ++i)
            acc += xp[i];
        y[p] = acc;
    }
}
