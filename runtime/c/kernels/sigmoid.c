/* sigmoid.c - see sigmoid.h. */
#include "sigmoid.h"

#include "../et_math.h"

void et_sigmoid_forward(int count, const float *x, float *y)
{
    int i;

    /* exp(-x) overflows to +inf for x < -88.7: 1 / inf = 0, as in torch. */
    for (i = 0; i < count; ++i)
        y[i] = 1.0f / (1.0f + et_expf(-x[i]));
}

void et_sigmoid_backward(int count, const float *gy, const float *y, float *gx)
{
    int i;

    for (i = 0; i < count; ++i)
        gx[i] = gy[i] * (1.0f - y[i]) * y[i];
}
