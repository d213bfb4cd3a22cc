/* flatten.c - see flatten.h. */
#include "flatten.h"

void et_flatten_copy(int count, const float *x, float *y)
{
    int i;

    if (x == y)
        return; /* the usual case: same arena offset, nothing to move */
    for (i = 0; i < count; ++i)
        y[i] = x[i];
}
