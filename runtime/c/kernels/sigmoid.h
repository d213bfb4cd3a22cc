/*
 * sigmoid.h - logistic sigmoid on `count` contiguous floats (any layout).
 *
 *   aten.sigmoid(self) -> out                          et_sigmoid_forward(count, self, out)
 *   aten.sigmoid_backward(grad_output, output) -> gx   et_sigmoid_backward(count, grad_output, output, gx)
 *
 * Forward y = 1 / (1 + exp(-x)) with et_expf (torch's vectorized formula; exp differs from torch's in
 * the last bit, so y agrees to ~2 ulp). Backward reads the saved OUTPUT y: gx = (gy * (1 - y)) * y, in
 * torch's order, so it is bit-identical given the same y. In place (y == x, gx == gy) is allowed.
 */
#ifndef ET_SIGMOID_H
#define ET_SIGMOID_H

void et_sigmoid_forward(int count, const float *x, float *y);
void et_sigmoid_backward(int count, const float *gy, const float *y, float *gx);

#endif /* ET_SIGMOID_H */
