/*
 * conv2d_weight_grad.h - the 2-D convolution's weight and bias gradients, alone or fused with the SGD step
 * (layouts and shape: conv2d.h).
 */
#ifndef ET_CONV2D_WEIGHT_GRAD_H
#define ET_CONV2D_WEIGHT_GRAD_H

#include "conv2d.h"
#include "sgd.h"

/* gw = dL/dw and (if gb != NULL) gb = dL/db, given gy and the forward input x. Overwrites gw, gb. */
void et_conv2d_backward_weight(const et_conv2d_shape *s, const float *gy, const float *x, float *gw,
                               float *gb);

/*
 * Fused weight gradient + SGD: for each weight element in turn, compute its gradient (the very same sum,
 * in the same order, as et_conv2d_backward_weight) and apply et_sgd_update to it at once; then the same
 * for the bias (b, b_buf may be NULL for no bias; w_buf, b_buf may be NULL when opt->momentum == 0; w, w_buf
 * NULL trains the bias alone, of a frozen weight, and then x is not read).
 * The result equals backward_weight followed by et_sgd_step bit for bit, without a gradient buffer.
 *
 * Ordering rule: this overwrites w, so it must run after every reader of this step's old weights -
 * in particular after et_conv2d_backward_input of the same layer, which needs them - and no forward
 * recompute of this layer may follow it within the step. It reads only gy and x, never w, so updating
 * one weight element never changes the gradient of another.
 */
void et_conv2d_wgrad_sgd(const et_conv2d_shape *s, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf);

#endif /* ET_CONV2D_WEIGHT_GRAD_H */
