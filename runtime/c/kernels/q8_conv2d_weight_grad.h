/*
 * q8_conv2d_weight_grad.h - int8 convolution's weight and bias gradients (layouts as q8_conv2d.h).
 *
 *   gw[oc][icg][kh][kw] = sum over n, oh, ow of gy[n][oc][oh][ow] * (x[n][ic][ih][iw] - x_zp)
 *   gb[oc]              = sum of gy[n][oc] (gb NULL: not wanted)
 * exact int32 sums (not requantised: at scale s_gy[oc] * s_x, for the optimizer to scale); padding adds
 * nothing. The sum is exact while n * h_out * w_out * 128 * 255 < 2^31 (n * h_out * w_out < 65794).
 *
 * et_q8_conv2d_backward_weight_ref is the plain loop; et_q8_conv2d_backward_weight the fast one where
 * ET_Q8_FAST (q8_arith.h), else the plain one. Where a group has 8 or more output channels (or 4, with a stride
 * along w above 1) it sums outer products of four output pixels at a time, whose windows its scratch holds
 * (et_q8_conv2d_weight_grad_scratch_size(s) int16 elements: interleaved int16, then bytes; unused otherwise);
 * other layers with stride 1 along w run each kernel tap's sum along contiguous rows of gy and x.
 */
#ifndef ET_Q8_CONV2D_WEIGHT_GRAD_H
#define ET_Q8_CONV2D_WEIGHT_GRAD_H

#include <stdint.h>

#include "conv2d.h"
#include "q8_arith.h"

void et_q8_conv2d_backward_weight_ref(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                      int32_t *gw, int32_t *gb);
int et_q8_conv2d_weight_grad_scratch_size(const et_conv2d_shape *s); /* int16 elements */
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int16_t *scratch, int32_t *gw, int32_t *gb);

#endif /* ET_Q8_CONV2D_WEIGHT_GRAD_H */
