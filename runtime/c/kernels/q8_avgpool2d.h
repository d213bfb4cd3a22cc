/*
 * q8_avgpool2d.h - int8 average pool (shape: pool2d.h, dilation 1), x and y sharing scale and zero point.
 *
 * Forward: y = zp + round(sum of (x - zp) over the window's inside / divisor), halves away from zero;
 * the divisor is torch's (count_include_pad: the window clipped to the padded input, else its inside),
 * and padding is a real 0 (x == zp) either way.
 * Backward (gy, gx symmetric, one scale): each output spreads gy * r over its window's inside, with
 * r = round(2^15 / divisor) the divisor's Q15 reciprocal; per input element the int32 sum is rounded
 * right by 15 (halves away from zero) and saturated.
 * et_q8_avgpool2d_backward_ref is the plain loop (per input element, the outputs whose window covers it);
 * et_q8_avgpool2d_backward writes each output's one rounded term over its window where windows cannot overlap
 * (stride >= kernel: the usual 2x2 stride-2 pool, a global pool), the plain loop elsewhere. Same bits.
 */
#ifndef ET_Q8_AVGPOOL2D_H
#define ET_Q8_AVGPOOL2D_H

#include <stdint.h>

#include "pool2d.h"

void et_q8_avgpool2d_forward(const et_pool2d_shape *s, const int8_t *x, int32_t zp, int8_t *y);
void et_q8_avgpool2d_backward_ref(const et_pool2d_shape *s, const int8_t *gy, int8_t *gx);
void et_q8_avgpool2d_backward(const et_pool2d_shape *s, const int8_t *gy, int8_t *gx);

#endif /* ET_Q8_AVGPOOL2D_H */
