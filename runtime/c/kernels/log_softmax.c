/*
 * log_softmax.c - see log_softmax.h.
 */
#include "log_softmax.h"

#include "../et_math.h"

void et_log_softmax_forward(int n, int classes, const float *x, float *y)
{
    int b, j;

    for (b = 0; b < n; ++b) {
        const float *xr = x + (long)b * classes;
        float *yr = y + (long)b * classes;
        float m = xr[0], sum = 0.0f, lse;
        for (j = 1; j < classes; ++j)
            if (xr[j] > m)
                m = xr[j];
        for (j = 0; j < classes; ++j)
            sum += et_expf(xr[j] - m);
        lse = et_logf(sum);
        for (j = 0; j < classes; ++j)
            yr[j] = (xr[j] - m) - lse;
    }
}

void et_log_softmax_backward(int n, int classes, const float *gy, const float *y, float *gx)
{
    int b, j;

    for (b = 0; b < n; ++b) {
        const float *gr = gy + (long)b * classes, *yr = y + (long)b * classes;
        float *gxr = gx + (long)b * classes;
        float sum = 0.0f;
        for (j = 0; j < classes; ++j)
            sum += gr[j];
        for (j = 0; j < classes; ++j)
            gxr[j] = gr[j] - et_expf(yr[j]) * sum;
    }
}
