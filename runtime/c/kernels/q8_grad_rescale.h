/*
 * q8_grad_rescale.h - an int8 output gradient requantised per channel onto one common scale before an input-gradient
 * sum over channels whose weights have per-channel scales (docs/int8-kernels.md, "The arithmetic"):
 * gy2[n][c][p] = requantize(gy[n][c][p], mult[c], shift[c]) within +-127, mult/shift expressing s_w[c] / max s_w
 * (<= 1), so that every channel's products with its weights carry the scale s_gy * max s_w. NCHW, hw = H * W.
 */
#ifndef ET_Q8_GRAD_RESCALE_H
#define ET_Q8_GRAD_RESCALE_H

#include <stdint.h>

#include "q8_arith.h"

void et_q8_grad_rescale(int n, int channels, int hw, const int8_t *gy, const int32_t *mult, const int32_t *shift,
                        int8_t *gy2);

#endif /* ET_Q8_GRAD_RESCALE_H */
