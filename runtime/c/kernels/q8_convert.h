/*
 * q8_convert.h - the edges of an int8 region in a float graph, and its residual add.
 *
 *   quantize:   y = clamp(round(x / s) + zp, -128, 127), the quotient in float32, halves to even (lrintf's
 *               rounding in the default mode, written with integers so that no libm or FPU mode is involved)
 *   dequantize: y = s * (float)(x - zp), one rounded float32 product
 *   add:        y = quantize(s_a * (a - zp_a) + s_b * (b - zp_b)), the dequantised operands summed in float32
 *
 * runtime/python/int8_prefix.py computes the same float32 operations: its results are these bits.
 * In place is not allowed (the element types differ).
 */
#ifndef ET_Q8_CONVERT_H
#define ET_Q8_CONVERT_H

#include <stdint.h>

void et_q8_quantize(int count, const float *x, float scale, int32_t zp, int8_t *y);
void et_q8_dequantize(int count, const int8_t *x, float scale, int32_t zp, float *y);
void et_q8_add(int count, const int8_t *a, float a_scale, int32_t a_zp, const int8_t *b, float b_scale,
               int32_t b_zp, float scale, int32_t zp, int8_t *y);

#endif /* ET_Q8_CONVERT_H */
