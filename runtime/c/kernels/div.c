/*
 * div.c - see div.h.
 */
#include "div.h"

void et_div_forward(int count, const float *a, const float *b, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = a[i] / b[i];
}

void et_div_scalar(int count, const float *x, float v, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = x[i] / v;
}
