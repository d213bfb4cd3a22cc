/*
 * q8_conv2d.h - int8 2-D convolution forward (groups incl. depthwise, stride, padding, dilation), NCHW.
 *
 * Layouts and shape as conv2d.h (et_conv2d_shape), with int8 tensors:
 *   x    [n][c_in][h_in][w_in]            int8, zero point x_zp (padding reads as x_zp: a real 0)
 *   w    [c_out][c_in / groups][k_h][k_w] int8, symmetric, one scale per output channel
 *   bias [c_out]                          int32 at scale s_x * s_w[oc] (NULL: none)
 *   y    [n][c_out][h_out][w_out]         int8 through q (mult/shift per output channel)
 * y[oc] = q(bias[oc] + sum (x - x_zp) * w): an exact int32 sum, requantised once (q8_arith.h).
 *
 * et_q8_conv2d_forward_ref is the plain loop, the definition. et_q8_conv2d_forward is the fast one where
 * the DSP extension exists (ET_Q8_FAST, q8_arith.h) and the plain one elsewhere; its scratch holds two output
 * pixels' windows as int16 (im2col) and one window's bytes, et_q8_conv2d_scratch_size(s) elements, unused by a depthwise 3-wide
 * kernel and by the plain build. Both give the same bits: integer sums do not depend on their order.
 */
#ifndef ET_Q8_CONV2D_H
#define ET_Q8_CONV2D_H

#include <stdint.h>

#include "conv2d.h"
#include "q8_arith.h"

int et_q8_conv2d_scratch_size(const et_conv2d_shape *s); /* int16 elements */

void et_q8_conv2d_forward_ref(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                              const int32_t *bias, const et_q8_requant *q, int8_t *y);
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int16_t *scratch, int8_t *y);

#endif /* ET_Q8_CONV2D_H */
