/* q8_grad_rescale.c - see q8_grad_rescale.h. */
#include "q8_grad_rescale.h"

void et_q8_grad_rescale(int n, int channels, int hw, const int8_t *gy, const int32_t *mult, const int32_t *shift,
                        int8_t *gy2)
{
    int b, c, p;

    for (b = 0; b < n; ++b)
        for (c = 0; c < channels; ++c) {
            const long base = ((long)b * channels + c) * hw;
            for (p = 0; p < hw; ++p) {
                const int32_t v = et_q8_requantize(gy[base + p], mult[c], shift[c]);
                gy2[base + p] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        }
}
