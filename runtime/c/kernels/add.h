/*
 * add.h - aten.add.Tensor of same-shape tensors, y = a + b (a residual, or the sum of a tensor's gradient
 * contributions), and aten.add.Scalar, y = x + v, on `count` contiguous floats. Aliasing y with an input is
 * allowed. (Add's backward is no kernel: both inputs' gradients are the output gradient itself.)
 */
#ifndef ET_ADD_H
#define ET_ADD_H

void et_add_forward(int count, const float *a, const float *b, float *y);
void et_add_scalar(int count, const float *x, float v, float *y);

#endif /* ET_ADD_H */
