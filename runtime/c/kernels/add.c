/* add.c - see add.h. One rounding per element, as torch's add: bit-identical. */
#include "add.h"

void et_add_forward(int count, const float *a, const float *b, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = a[i] + b[i];
}

void et_add_scalar(int count, const float *x, float v, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = x[i] + v;
}
