/*
 * sub.c - see sub.h.
 */
#include "sub.h"

void et_sub_forward(int count, const float *a, const float *b, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = a[i] - b[i];
}
