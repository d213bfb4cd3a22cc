/*
 * q8_relu6.h - int8 ReLU6: y = min(max(x, zp), q6), q6 = the int8 of 6.0 (zp + round(6 / s), at most 127);
 * x and y share scale and zero point. Backward reads the saved output: gx = gy where zp < y < q6, else 0
 * (hardtanh_backward's strict bounds). In place allowed.
 * _ref is the plain loop; the other uses SSUB8/SEL where the DSP extension exists, else the plain loop.
 */
#ifndef ET_Q8_RELU6_H
#define ET_Q8_RELU6_H

#include <stdint.h>

void et_q8_relu6_forward_ref(int count, const int8_t *x, int32_t zp, int32_t q6, int8_t *y);
void et_q8_relu6_forward(int count, const int8_t *x, int32_t zp, int32_t q6, int8_t *y);
void et_q8_relu6_backward_ref(int count, const int8_t *gy, const int8_t *y, int32_t zp, int32_t q6, int8_t *gx);
void et_q8_relu6_backward(int count, const int8_t *gy, const int8_t *y, int32_t zp, int32_t q6, int8_t *gx);

#endif /* ET_Q8_RELU6_H */
