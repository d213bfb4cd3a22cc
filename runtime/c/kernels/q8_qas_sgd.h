/*
 * q8_qas_sgd.h - SGD of an int32 bias with Quantization-Aware Scaling (tiny-training): the step is the real-valued
 * SGD step put on the bias's integer grid. Per channel c, in float32 and in this order:
 *
 *   g = s_g * (float)gb[c]                      the bias gradient in real units (gb: exact int32 sums at scale s_g)
 *   g = g + weight_decay * (s_b[c] * (float)b[c])   (only where weight_decay != 0)
 *   m[c] = momentum * m[c] + g; d = m[c]        (only where momentum != 0; m starts at 0: torch's buffer)
 *   b[c] = sat32(b[c] - round(lr * d / s_b[c]))     round: halves to even, saturated to int32
 *
 * s_b[c] = s_x * s_w[c], the bias's scale. runtime/python/int8_qas.py's bias_step computes the same bits.
 */
#ifndef ET_Q8_QAS_SGD_H
#define ET_Q8_QAS_SGD_H

#include <stdint.h>

void et_q8_qas_sgd(int channels, const int32_t *gb, float s_g, const float *s_b, float lr, float momentum,
                   float weight_decay, int32_t *b, float *m);

#endif /* ET_Q8_QAS_SGD_H */
