/*
 * q8_bias_grad.h - a convolution's bias gradient from its int8 output gradient: gb[c] = the exact int32 sum of
 * gy[n][c][p] over the batch and the positions (NCHW, hw = H * W); its scale is gy's (int8 bias training).
 */
#ifndef ET_Q8_BIAS_GRAD_H
#define ET_Q8_BIAS_GRAD_H

#include <stdint.h>

void et_q8_bias_grad(int n, int channels, int hw, const int8_t *gy, int32_t *gb);

#endif /* ET_Q8_BIAS_GRAD_H */
