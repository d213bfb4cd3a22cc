/*
 * q8_relu.h - int8 ReLU: y = max(x, zp) (x and y share scale and zero point zp: a real 0 is zp).
 * Backward reads the saved output: gx = gy where y > zp, else 0. In place allowed.
 * _ref is the plain loop; the other uses SSUB8/SEL (four lanes per instruction pair) where the DSP
 * extension exists (__ARM_FEATURE_DSP), else the plain loop.
 */
#ifndef ET_Q8_RELU_H
#define ET_Q8_RELU_H

#include <stdint.h>

void et_q8_relu_forward_ref(int count, const int8_t *x, int32_t zp, int8_t *y);
void et_q8_relu_forward(int count, const int8_t *x, int32_t zp, int8_t *y);
void et_q8_relu_backward_ref(int count, const int8_t *gy, const int8_t *y, int32_t zp, int8_t *gx);
void et_q8_relu_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int8_t *gx);

#endif /* ET_Q8_RELU_H */
