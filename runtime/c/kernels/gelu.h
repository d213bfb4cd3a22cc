/*
 * gelu.h - GELU on `count` contiguous floats, exact (erf) or tanh-approximated.
 *
 *   aten.gelu(self, approximate) -> out
 *       et_gelu_forward(count, self, approximate == "tanh", out)
 *   aten.gelu_backward(grad_output, self, approximate) -> gx
 *       et_gelu_backward(count, grad_output, self, approximate == "tanh", gx)
 *
 * torch's CPU formulas, operation for operation, with et_erff / et_tanhf / et_expf in place of its
 * vectorized erf / tanh / exp (so results agree to a few ulp, not bitwise):
 *   'none':  y  = x * 0.5 * (1 + erf(x * sqrt(1/2)))
 *            gx = gy * (0.5 * (1 + erf(x * sqrt(1/2))) + x * (1/sqrt(2 pi)) * exp(x * x * -0.5))
 *   'tanh':  u  = sqrt(2/pi) * (x + 0.044715 * x^3),  y = 0.5 * x * (1 + tanh(u))
 *            gx = gy * (0.5 * (1 + tanh(u)) + 0.5 * x * (1 - tanh(u)^2) * sqrt(2/pi) * (1 + 3 * 0.044715 * x^2))
 * The backward reads the forward INPUT x. In place is allowed.
 */
#ifndef ET_GELU_H
#define ET_GELU_H

void et_gelu_forward(int count, const float *x, int approximate_tanh, float *y);
void et_gelu_backward(int count, const float *gy, const float *x, int approximate_tanh, float *gx);

#endif /* ET_GELU_H */
