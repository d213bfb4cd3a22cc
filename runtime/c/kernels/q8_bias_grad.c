/* q8_bias_grad.c - see q8_bias_grad.h. */
#include "q8_bias_grad.h"

void et_q8_bias_grad(int n, int channels, int hw, const int8_t *gy, int32_t *gb)
{
    int b, c, p;

    for (c = 0; c < channels; ++c)
        gb[c] = 0;
    for (b = 0; b < n; ++b)
        for (c = 0; c < channels; ++c) {
            const int8_t *g = gy + ((long)b * channels + c) * hw;
            int32_t acc = 0;
            for (p = 0; p < hw; ++p)
                acc += g[p];
            gb[c] += acc;
        }
}
