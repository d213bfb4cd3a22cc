/*
 * mul.h - element-wise multiply: same shape, and the channel-scale broadcast of squeeze-excitation.
 *
 *   aten.mul.Tensor(self, other), same shapes -> out
 *       et_mul_forward(count, self, other, out)
 *   aten.mul.Tensor(x [n][c][h][w], s [n][c][1][1]) -> y [n][c][h][w]   (either argument order)
 *       et_mul_bcast_forward(n * c, h * w, x, s, y):  y[p][i] = x[p][i] * s[p]
 *
 * Backward as the joint graph spells it for y = x * s (s broadcast over h, w):
 *   grad_x = aten.mul.Tensor(gy, s)                         -> et_mul_bcast_forward(n*c, hw, gy, s, grad_x)
 *   grad_s = aten.sum.dim_IntList(aten.mul.Tensor(gy, x), [2, 3], keepdim=True)
 *                                                           -> et_mul_bcast_backward_scale(n*c, hw, gy, x, grad_s)
 * The fused grad_s sums the rounded products gy*x (as torch's two ops do) sequentially per plane, so
 * no [n][c][h][w] product buffer exists; torch's sum kernel adds in a vectorized order, so grad_s
 * agrees with it to float32 rounding. A same-shape mul's gradients are et_mul_forward(gy, other) and
 * et_mul_forward(gy, self). Products are single roundings: every forward here is bit-identical to torch.
 * In place (out == self or other, y == x, grad_x == gy) is allowed; grad_s must not alias its inputs.
 */
#ifndef ET_MUL_H
#define ET_MUL_H

void et_mul_forward(int count, const float *a, const float *b, float *y);
void et_mul_bcast_forward(int planes, int hw, const float *x, const float *s, float *y);
void et_mul_bcast_backward_scale(int planes, int hw, const float *gy, const float *x, float *gs);

#endif /* ET_MUL_H */
