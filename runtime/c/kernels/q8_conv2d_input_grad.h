/*
 * q8_conv2d_input_grad.h - int8 convolution's input gradient gx = dL/dx (layouts as q8_conv2d.h).
 *
 * gy is symmetric int8; gx[ic] = q(sum over the output channels of ic's group and the kernel taps that
 * read ic's pixel of gy * w), one exact int32 sum per element, requantised by q's entry for input
 * channel ic (out_zp 0 for a gradient). With per-channel weight scales the sum is one scale when gy's
 * channels carry scales s_gy[oc] with s_gy[oc] * s_w[oc] the same for all oc (each gradient requantised
 * per channel by the kernel before it); with one weight scale any gy scale works.
 *
 * et_q8_conv2d_backward_input_ref is the plain loop; et_q8_conv2d_backward_input the fast one where
 * ET_Q8_FAST (q8_arith.h), else the plain one. Its scratch, et_q8_conv2d_input_grad_scratch_size(s) int16
 * elements, holds the gradients two input pixels read and one group's weights transposed (unused by a
 * depthwise 3-wide stride-1 kernel and by the plain build).
 */
#ifndef ET_Q8_CONV2D_INPUT_GRAD_H
#define ET_Q8_CONV2D_INPUT_GRAD_H

#include <stdint.h>

#include "conv2d.h"
#include "q8_arith.h"

int et_q8_conv2d_input_grad_scratch_size(const et_conv2d_shape *s); /* int16 elements */

void et_q8_conv2d_backward_input_ref(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                     const et_q8_requant *q, int8_t *gx);
void et_q8_conv2d_backward_input(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int16_t *scratch, int8_t *gx);

#endif /* ET_Q8_CONV2D_INPUT_GRAD_H */
