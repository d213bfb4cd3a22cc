/*
 * conv2d.h - 2-D convolution (cross-correlation, as torch.nn.Conv2d), NCHW, float32.
 *
 * Layouts (all contiguous, row-major):
 *   x  [n][c_in][h_in][w_in]                 gx likewise
 *   w  [c_out][c_in / groups][k_h][k_w]      gw likewise
 *   b  [c_out]                               gb likewise (NULL: no bias)
 *   y  [n][c_out][h_out][w_out]              gy likewise
 * with h_out = (h_in + 2*pad_h - dil_h*(k_h - 1) - 1) / stride_h + 1 (and the same for w).
 * Groups: output channel oc reads input channels g*(c_in/groups) .. (g+1)*(c_in/groups) - 1 where
 * g = oc / (c_out/groups); depthwise convolution is groups == c_in (c_out a multiple of c_in).
 *
 * No kernel allocates; outputs never alias inputs. Backward is split so that a fused weight update can
 * follow the input gradient that still needs the old weights:
 *   et_conv2d_backward_input   gx = dL/dx       (reads w)
 *   et_conv2d_backward_weight  gw, gb = dL/dw, dL/db
 *   et_conv2d_wgrad_sgd        the weight gradient and the SGD step in one pass, no gradient buffer
 */
#ifndef ET_CONV2D_H
#define ET_CONV2D_H

#include "sgd.h"

typedef struct et_conv2d_shape {
    int n;                        /* batch */
    int c_in, h_in, w_in;         /* input */
    int c_out, h_out, w_out;      /* output */
    int k_h, k_w;                 /* kernel */
    int stride_h, stride_w;
    int pad_h, pad_w;             /* zero padding on each side */
    int dil_h, dil_w;             /* dilation, 1 for a plain convolution */
    int groups;
} et_conv2d_shape;

/* ET_OK if the shape is consistent (positive sizes, groups divide the channels, h_out/w_out match). */
int et_conv2d_shape_check(const et_conv2d_shape *s);

/* y = conv(x, w) + b. */
void et_conv2d_forward(const et_conv2d_shape *s, const float *x, const float *w, const float *b, float *y);

/* gx = dL/dx given gy = dL/dy. Overwrites gx (no need to zero it). */
void et_conv2d_backward_input(const et_conv2d_shape *s, const float *gy, const float *w, float *gx);

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

#endif /* ET_CONV2D_H */
