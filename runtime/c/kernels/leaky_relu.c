/* leaky_relu.c - see leaky_relu.h. */
#include "leaky_relu.h"

void et_leaky_relu_forward(int count, const float *x, float negative_slope, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = x[i] > 0.0f ? x[i] : x[i] * negative_slope;
}

void et_leaky_relu_backward(int count, const float *gy, const float *x, float negative_slope, float *gx)
{
    int i;

    for (i = 0; i < count; ++i)
        gx[i] = x[i] > 0.0f ? gy[i] : gy[i] * negative_slope;
}
