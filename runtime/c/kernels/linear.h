/*
 * linear.h - fully connected layer, y = x W^T + b (torch.nn.Linear), float32.
 *
 * Layouts: x [n][in], W [out][in] (torch's layout), b [out] (NULL: no bias), y [n][out]; gradients
 * have the shape of what they differentiate. An NCHW activation feeds it directly: flattening a
 * contiguous [n][c][h][w] tensor to [n][c*h*w] moves no data (see flatten.h).
 *
 * Backward is split like conv2d's: input gradient (reads W), weight gradient, and the fused weight
 * gradient + SGD step, which must run after the input gradient (it overwrites W).
 */
#ifndef ET_LINEAR_H
#define ET_LINEAR_H

#include "sgd.h"

/* y[i][o] = sum_k x[i][k] * W[o][k] + b[o]. */
void et_linear_forward(int n, int in, int out, const float *x, const float *w, const float *b, float *y);

/* gx[i][k] = sum_o gy[i][o] * W[o][k]. Overwrites gx. */
void et_linear_backward_input(int n, int in, int out, const float *gy, const float *w, float *gx);

/* gW[o][k] = sum_i gy[i][o] * x[i][k]; gb[o] = sum_i gy[i][o] (skipped if gb == NULL). Overwrites both. */
void et_linear_backward_weight(int n, int in, int out, const float *gy, const float *x, float *gw, float *gb);

/*
 * Fused weight gradient + SGD: each element of W (then of b) gets its gradient - the same sum, in the same
 * order, as et_linear_backward_weight - and et_sgd_update at once; bit-identical to the two separate steps,
 * with no gradient buffer. b, b_buf may be NULL (no bias); w_buf, b_buf may be NULL when momentum == 0;
 * w, w_buf NULL updates the bias alone (a frozen weight, or torch's separate bias gradient), reading
 * neither x nor in.
 * Ordering rule: run it after et_linear_backward_input of the same layer (which needs the old W) and after
 * any other reader of W in this step; it reads gy and x only, never W.
 */
void et_linear_wgrad_sgd(int n, int in, int out, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf);

#endif /* ET_LINEAR_H */
