/*
 * q8_linear.h - int8 fully connected layer, y = x W^T + b, and its gradients.
 *
 *   x [n][in] int8 (zero point x_zp), w [out][in] int8 (symmetric, one scale per output),
 *   bias [out] int32 at s_x * s_w[o] (NULL: none), y [n][out] int8 through q (per output)
 *   forward          y[i][o]  = q(bias[o] + sum_k (x[i][k] - x_zp) * w[o][k])
 *   backward_input   gx[i][k] = q(sum_o gy[i][o] * w[o][k])          q per input feature, out_zp 0
 *   backward_weight  gw[o][k] = sum_i gy[i][o] * (x[i][k] - x_zp),  gb[o] = sum_i gy[i][o]   (int32)
 * Sums are exact int32 (q8_arith.h for the requantisation and the per-channel gradient scales).
 *
 * The _ref functions are the plain loops; the others are the fast ones where ET_Q8_FAST (q8_arith.h),
 * else the plain ones. The fast weight gradient (an outer product at batch 1: one multiply per output, nothing for
 * SMLAD to pair) unpacks four features of x - x_zp per SXTAB16 pair and multiplies halves (SMULBB/SMULTB).
 */
#ifndef ET_Q8_LINEAR_H
#define ET_Q8_LINEAR_H

#include <stdint.h>

#include "q8_arith.h"

void et_q8_linear_forward_ref(int n, int in, int out, const int8_t *x, int32_t x_zp, const int8_t *w,
                              const int32_t *bias, const et_q8_requant *q, int8_t *y);
void et_q8_linear_forward(int n, int in, int out, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int8_t *y);
void et_q8_linear_backward_input_ref(int n, int in, int out, const int8_t *gy, const int8_t *w,
                                     const et_q8_requant *q, int8_t *gx);
void et_q8_linear_backward_input(int n, int in, int out, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int8_t *gx);
void et_q8_linear_backward_weight_ref(int n, int in, int out, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                      int32_t *gw, int32_t *gb);
void et_q8_linear_backward_weight(int n, int in, int out, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int32_t *gw, int32_t *gb);

#endif /* ET_Q8_LINEAR_H */
