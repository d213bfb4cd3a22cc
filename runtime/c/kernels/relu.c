/* relu.c - see relu.h. Written as torch's kernels compare, so NaN and -0.0 behave as in torch. */
#include "relu.h"

void et_relu_forward(int count, const float *x, float *y)
{
    int i;

    /* "x < 0 ? 0 : x" rather than "x > 0 ? x : 0": a NaN passes through (torch.relu(nan) is nan). */
    for (i = 0; i < count; ++i)
        y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void et_relu_backward(int count, const float *gy, const float *y, float *gx)
{
    int i;

    /* threshold_backward(gy, y, 0): the gradient is cut where y <= 0 (so at y == 0, as torch does). */
    for (i = 0; i < count; ++i)
        gx[i] = y[i] <= 0.0f ? 0.0f : gy[i];
}
