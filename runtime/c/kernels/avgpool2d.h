/*
 * avgpool2d.h - 2-D average pooling (torch.nn.AvgPool2d), NCHW, float32. Shapes: pool2d.h (dil_h and
 * dil_w must be 1). count_include_pad != 0 divides by the window size including zero padding (torch's
 * default), 0 by the number of real elements. No divisor_override.
 *
 * The loops, the float accumulator and the division (not a multiply by a reciprocal) are those of
 * PyTorch's cpu_avg_pool / cpu_avg_pool_backward for contiguous NCHW, so results match bit for bit.
 */
#ifndef ET_AVGPOOL2D_H
#define ET_AVGPOOL2D_H

#include "pool2d.h"

int et_avgpool2d_shape_check(const et_pool2d_shape *s);

void et_avgpool2d_forward(const et_pool2d_shape *s, const float *x, float *y);
/* Overwrites all of gx: zeroes it, then spreads each gy / divisor over its window, in output order. */
void et_avgpool2d_backward(const et_pool2d_shape *s, const float *gy, float *gx);

#endif /* ET_AVGPOOL2D_H */
