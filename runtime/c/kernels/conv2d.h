/*
 * conv2d.h - 2-D convolution (cross-correlation, as torch.nn.Conv2d), NCHW, float32: the shape and the forward.
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
 *   et_conv2d_backward_input   gx = dL/dx       (reads w)                  conv2d_input_grad.h
 *   et_conv2d_backward_weight  gw, gb = dL/dw, dL/db                       conv2d_weight_grad.h
 *   et_conv2d_wgrad_sgd        the weight gradient and the SGD step in one pass, no gradient buffer
 */
#ifndef ET_CONV2D_H
#define ET_CONV2D_H

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

#endif /* ET_CONV2D_H */
