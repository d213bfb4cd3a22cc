/* hardswish.c - see hardswish.h. */
#include "hardswish.h"

void et_hardswish_forward(int count, const float *x, float *y)
{
    int i;

    for (i = 0; i < count; ++i) {
        const float v = x[i];
        float t = v + 3.0f;
        t = t < 0.0f ? 0.0f : t; /* false for NaN: NaN passes through */
        t = t > 6.0f ? 6.0f : t;
        y[i] = v * t / 6.0f;
    }
}

void et_hardswish_backward(int count, const float *gy, const float *x, float *gx)
{
    int i;

    for (i = 0; i < count; ++i) {
        const float v = x[i];
        if (v <= -3.0f)
            gx[i] = 0.0f;
        else if (v >= 3.0f)
            gx[i] = gy[i];
        else
            gx[i] = gy[i] * (v / 3.0f + 0.5f);
    }
}
