/* add.c - see add.h. One rounding per element, as torch's add: bit-identical. */
#include "add.h"

void et_add_forward(int count, const float *a, const float *b, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = a[i] + b[i];
}

void et_add_into(int count, float *acc, const float *g)
{
    int i;

    for (i = 0; i < count; ++i)
        acc[i] += g[i];
}
