/*
 * hardsigmoid.h - hard sigmoid, y = min(max(x + 3, 0), 6) / 6, on `count` contiguous floats.
 *
 *   aten.hardsigmoid(self) -> out                            et_hardsigmoid_forward(count, self, out)
 *   aten.hardsigmoid_backward(grad_output, self) -> gx       et_hardsigmoid_backward(count, grad_output, self, gx)
 *
 * Backward reads the forward INPUT x: gx = gy * (1/6) where -3 < x < 3 (open interval: 0 at exactly
 * -3 and +3), else 0; torch multiplies by the float 1/6, it does not divide. Both are torch's CPU formulas
 * operation for operation (bit-identical); a NaN input gives NaN forward and 0 backward, as in torch.
 * In place is allowed.
 */
#ifndef ET_HARDSIGMOID_H
#define ET_HARDSIGMOID_H

void et_hardsigmoid_forward(int count, const float *x, float *y);
void et_hardsigmoid_backward(int count, const float *gy, const float *x, float *gx);

#endif /* ET_HARDSIGMOID_H */
