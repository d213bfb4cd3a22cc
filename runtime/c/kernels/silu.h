/*
 * silu.h - SiLU (swish), y = x * sigmoid(x), on `count` contiguous floats.
 *
 *   aten.silu(self) -> out                          et_silu_forward(count, self, out)
 *   aten.silu_backward(grad_output, self) -> gx     et_silu_backward(count, grad_output, self, gx)
 *
 * torch's CPU formulas with et_expf: y = x / (1 + exp(-x)); backward reads the forward INPUT x,
 * s = 1 / (1 + exp(-x)), gx = gy * s * (1 + x * (1 - s)). exp differs from torch's in the last bit, so
 * results agree to a few ulp. In place is allowed.
 */
#ifndef ET_SILU_H
#define ET_SILU_H

void et_silu_forward(int count, const float *x, float *y);
void et_silu_backward(int count, const float *gy, const float *x, float *gx);

#endif /* ET_SILU_H */
