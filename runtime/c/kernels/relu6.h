/*
 * relu6.h - ReLU6, y = min(max(x, 0), 6) (torch.nn.ReLU6 = hardtanh(x, 0, 6)), on `count` floats.
 *
 * Backward reads the saved output y: gx = gy where 0 < y < 6, else 0 - the mask torch computes from the
 * input, since 0 < y < 6 exactly where 0 < x < 6. In-place use is allowed.
 */
#ifndef ET_RELU6_H
#define ET_RELU6_H

void et_relu6_forward(int count, const float *x, float *y);
void et_relu6_backward(int count, const float *gy, const float *y, float *gx);

#endif /* ET_RELU6_H */
