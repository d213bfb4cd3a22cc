/*
 * q8_conv2d_input_grad_sums.h - an int8 convolution's input gradient as its exact int32 sums (layouts as
 * q8_conv2d.h): acc[n][ic][ih][iw] = sum over the output channels of ic's group and the kernel taps that read the
 * pixel of gy * w, the sums et_q8_conv2d_backward_input requantises. int8 bias training quantises them by their own
 * largest magnitude (et_q8_sums_quantize), which a fixed per-channel requantisation cannot. A plain loop.
 */
#ifndef ET_Q8_CONV2D_INPUT_GRAD_SUMS_H
#define ET_Q8_CONV2D_INPUT_GRAD_SUMS_H

#include <stdint.h>

#include "conv2d.h"

void et_q8_conv2d_backward_input_sums(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, int32_t *acc);

#endif /* ET_Q8_CONV2D_INPUT_GRAD_SUMS_H */
