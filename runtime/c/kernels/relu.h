/*
 * relu.h - ReLU, y = max(x, 0), on `count` contiguous floats (any layout).
 *
 * Backward reads the saved OUTPUT y, not the input (the op registry saves "out"): gx = gy where y > 0,
 * else 0 - the same mask, since y > 0 exactly where x > 0. In-place use (y == x, gx == gy) is allowed.
 */
#ifndef ET_RELU_H
#define ET_RELU_H

void et_relu_forward(int count, const float *x, float *y);
void et_relu_backward(int count, const float *gy, const float *y, float *gx);

#endif /* ET_RELU_H */
