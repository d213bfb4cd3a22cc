/*
 * conv2d_input_grad.h - the 2-D convolution's input gradient (layouts and shape: conv2d.h).
 */
#ifndef ET_CONV2D_INPUT_GRAD_H
#define ET_CONV2D_INPUT_GRAD_H

#include "conv2d.h"

/* gx = dL/dx given gy = dL/dy. Overwrites gx (no need to zero it). */
void et_conv2d_backward_input(const et_conv2d_shape *s, const float *gy, const float *w, float *gx);

#endif /* ET_CONV2D_INPUT_GRAD_H */
