/*
 * fill.c - see fill.h.
 */
#include "fill.h"

void et_fill(int count, float v, float *y)
{
    int i;

    for (i = 0; i < count; ++i)
        y[i] = v;
}
