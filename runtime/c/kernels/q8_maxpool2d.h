/*
 * q8_maxpool2d.h - int8 max-pool (shape: pool2d.h; padding never wins; first max wins, as torch).
 * x and y share scale and zero point; idx [n][c][h_out][w_out] is the argmax's flat index h*w_in + w in
 * its plane (torch's indices). Backward: gx[i] = the saturated int8 of the int32 sum of the gradients of
 * every output whose argmax is i (same scale as gy).
 * Plain loops only: a window is a few compares with nothing for SMLAD to pair.
 */
#ifndef ET_Q8_MAXPOOL2D_H
#define ET_Q8_MAXPOOL2D_H

#include <stdint.h>

#include "pool2d.h"

void et_q8_maxpool2d_forward(const et_pool2d_shape *s, const int8_t *x, int8_t *y, int32_t *idx);
void et_q8_maxpool2d_backward(const et_pool2d_shape *s, const int8_t *gy, const int32_t *idx, int8_t *gx);

#endif /* ET_Q8_MAXPOOL2D_H */
