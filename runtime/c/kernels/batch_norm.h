/*
 * batch_norm.h - batch normalization in training mode, NCHW, float32 (torch.nn.BatchNorm2d.train()).
 *
 * Layouts: x, y, gy, gx [n][c][hw] (hw = h*w; any trailing size works, BatchNorm1d on [n][c] is hw = 1);
 * w (weight, gamma), b (bias, beta), save_mean, save_invstd, var_sum, running_mean, running_var,
 * gw, gb: [c]. w == NULL means weight 1 and b == NULL bias 0 (affine=False, where aten gets None).
 * count = n * hw, the number of elements per channel.
 *
 * ATen ops and argument mapping (momentum, eps: the aten doubles; momentum is rounded to float as
 * torch's CPU kernel does, eps stays double as torch adds it in double):
 *
 *   aten._native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
 *                                            training=True, momentum, eps)
 *       -> (out, save_mean, save_rstd, new_running_mean, new_running_var)
 *   (also aten.native_batch_norm / aten._native_batch_norm_legit with training=True: the same values,
 *    the running statistics updated in place)
 *     et_batch_norm_forward(n, c, hw, input, weight, bias, eps, out, save_mean, save_rstd, var_sum)
 *     et_batch_norm_update_running_stats(c, n*hw, momentum, save_mean, var_sum,
 *                                        running_mean -> new_running_mean, running_var -> new_running_var)
 *   The update is separate so that a recompute of the forward (var_sum = NULL) leaves the running
 *   statistics alone: they change once per step. In place is allowed (new_running_* == running_*).
 *
 *   aten.native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
 *                                   save_invstd, train=True, eps, output_mask)
 *       -> (grad_input, grad_weight, grad_bias)
 *     et_batch_norm_backward(n, c, hw, grad_out, input, weight, save_mean, save_invstd,
 *                            grad_input, grad_weight, grad_bias)
 *   running_mean, running_var and eps are unused in training mode; output_mask[i] false -> pass NULL.
 *   With frozen affine parameters (requires_grad False) aten asks for grad_input only: gw = gb = NULL.
 *
 * Semantics (torch's CPU kernel, operation for operation):
 *   forward, per channel:  sum = double sum of x;  mean = (float)(sum / count)
 *                          var_sum = (float)(double sum of (float)((x - mean) * (x - mean)))
 *                          invstd = (float)(1 / sqrt((double)(var_sum / (float)count) + eps))
 *                          alpha = invstd * w;  beta = fmaf(-mean, alpha, b);  y = fmaf(x, alpha, beta)
 *   running stats:         rm' = m * mean + (1 - m) * rm                 (float, no fused multiply-add)
 *                          rv' = (float)((double)m * (double)(var_sum / (float)(count - 1))
 *                                        + (double)((1 - m) * rv))       (count 1: var_sum / 0, as torch)
 *   backward, per channel: sum = sum gy,  dotp = sum (x - mean) * gy  (float per [hw] plane, the planes
 *                          added in double); gw = dotp * invstd, gb = sum;
 *                          k = dotp * invstd * invstd / count, grad_mean = sum / count
 *                          gx = fmaf(-(x - mean), k, gy - grad_mean) * invstd * w
 * Forward, statistics and running statistics are bit-identical to torch (its double accumulators are
 * reproduced) when hw > 1; for hw == 1 torch switches to a float-accumulating channels-last kernel and
 * they agree to float32 rounding. The backward is bit-identical when its sums are exact; its sums use torch's plane structure but not its vector-lane order, so they
 * agree to float32 rounding. Doubles are software floating point on a Cortex-M4F: the forward's two
 * double additions per element are its cost of being exact.
 *
 * No kernel allocates; y, gx must not alias x or gy.
 */
#ifndef ET_BATCH_NORM_H
#define ET_BATCH_NORM_H

#include "sgd.h"

/* y, save_mean, save_invstd; var_sum (may be NULL) keeps each channel's sum of squared deviations
 * for et_batch_norm_update_running_stats. */
void et_batch_norm_forward(int n, int c, int hw, const float *x, const float *w, const float *b, double eps,
                           float *y, float *save_mean, float *save_invstd, float *var_sum);

/* Evaluation mode (inference): y = (x - running_mean) / sqrt(running_var + eps) * w + b, per channel. */
void et_batch_norm_eval(int n, int c, int hw, const float *x, const float *w, const float *b,
                        const float *running_mean, const float *running_var, double eps, float *y);

/* running_mean, running_var updated in place from the forward's save_mean and var_sum. */
void et_batch_norm_update_running_stats(int c, long count, float momentum, const float *save_mean,
                                        const float *var_sum, float *running_mean, float *running_var);

/* Any of gx, gw, gb may be NULL (not computed). w == NULL: weight 1. Overwrites what it computes. */
void et_batch_norm_backward(int n, int c, int hw, const float *gy, const float *x, const float *w,
                            const float *save_mean, const float *save_invstd, float *gx, float *gw, float *gb);

/*
 * Backward with the affine update fused: per channel, the same sums as et_batch_norm_backward, then
 * gx (if gx != NULL, with the OLD weight), then et_sgd_update of w[ch] with dotp * invstd and of b[ch]
 * with sum - bit-identical to et_batch_norm_backward followed by et_sgd_step on gw and gb, with no
 * gradient buffer and one pass over x and gy. w or b NULL: that one is not updated (frozen; a frozen
 * weight's gx comes from et_batch_norm_backward, since here w == NULL reads as weight 1); w_buf, b_buf may be
 * NULL when opt->momentum == 0. Ordering rule (as et_conv2d_wgrad_sgd): it overwrites w and b, so every other
 * reader of this step's old w, b (a recompute of this layer's forward) must come before it.
 */
void et_batch_norm_backward_sgd(int n, int c, int hw, const float *gy, const float *x, const float *save_mean,
                                const float *save_invstd, const et_sgd_params *opt, float *gx,
                                float *w, float *w_buf, float *b, float *b_buf);

#endif /* ET_BATCH_NORM_H */
