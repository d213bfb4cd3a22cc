/*
 * q8_grad_quantize.h - a gradient made symmetric int8 with one scale for the tensor, chosen from the gradient itself
 * (int8 bias training, runtime/python/int8_qas.py: these are its bits).
 *
 *   et_q8_grad_quantize: float32 g -> q = round(g / s), s = max|g| / 127 (float32), halves to even, within +-127;
 *                        returns s. A gradient with no finite nonzero largest magnitude gives zeros and s = 0.
 *   et_q8_sums_quantize: exact int32 sums in units of `unit` -> q = round(acc * 127 / M), M = max|acc|, halves away
 *                        from zero, in integers; returns unit * M / 127 (float32, in that order); M = 0: zeros, 0.
 */
#ifndef ET_Q8_GRAD_QUANTIZE_H
#define ET_Q8_GRAD_QUANTIZE_H

#include <stdint.h>

float et_q8_grad_quantize(int count, const float *g, int8_t *q);
float et_q8_sums_quantize(int count, const int32_t *acc, float unit, int8_t *q);

#endif /* ET_Q8_GRAD_QUANTIZE_H */
