/*
 * layer_norm.h - layer normalization over the last dimensions, float32 (torch.nn.LayerNorm).
 *
 * Layouts: x, y, gy, gx [rows][cols] where cols = the product of normalized_shape and rows = the product
 * of the leading dimensions (an NCHW tensor normalized over (C, H, W) is rows = n, cols = c*h*w);
 * w (weight), b (bias), gw, gb [cols] (w == NULL: weight 1, b == NULL: bias 0); mean, rstd [rows].
 *
 *   aten.native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)
 *       et_layer_norm_forward(rows, cols, input, weight, bias, eps, out, mean, rstd)
 *   aten.native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
 *                                   output_mask) -> (grad_input, grad_weight, grad_bias)
 *       et_layer_norm_backward(rows, cols, grad_out, input, mean, rstd, weight, grad_input, grad_weight,
 *                              grad_bias)          (output_mask[i] false -> NULL; bias is unused)
 *       et_layer_norm_backward_sgd(rows, cols, grad_out, input, mean, rstd, &opt, grad_input, weight, w_buf,
 *                                  bias, b_buf)    (the parameter gradients applied by SGD at once: no buffer;
 *                                                   grad_input first, with this step's weight; NULL: skipped)
 * mean and rstd may be NULL in the forward (nothing reads them).
 *
 * Semantics (torch's CPU kernel's formulas): per row, mean and biased variance var (accumulated in
 * double here; torch uses a vectorized Welford, so they agree to float32 rounding), rstd = (float)(1 / sqrt(
 * max(var, 0) + eps)) in double (eps is the aten double), y = (x * rstd + (-mean * rstd)) * w + b. Backward per row, with
 * ds = sum gy * w * x, db = sum gy * w, s = 1 / cols:
 *   b_ = (db * mean - ds) * rstd^3 * s,  c_ = -b_ * mean - db * rstd * s,  gx = rstd * gy * w + b_ * x + c_
 * gw[j] = sum over rows of gy * (x - mean) * rstd, gb[j] = sum over rows of gy (rows in order).
 * No kernel allocates; outputs must not alias inputs.
 */
#ifndef ET_LAYER_NORM_H
#define ET_LAYER_NORM_H

#include "sgd.h"

void et_layer_norm_forward(int rows, int cols, const float *x, const float *w, const float *b, double eps,
                           float *y, float *mean, float *rstd);

void et_layer_norm_backward(int rows, int cols, const float *gy, const float *x, const float *mean,
                            const float *rstd, const float *w, float *gx, float *gw, float *gb);

void et_layer_norm_backward_sgd(int rows, int cols, const float *gy, const float *x, const float *mean,
                                const float *rstd, const et_sgd_params *opt, float *gx, float *w, float *w_buf,
                                float *b, float *b_buf);

#endif /* ET_LAYER_NORM_H */
