/*
 * dropout.h - dropout on `count` contiguous floats with a counter-based mask: nothing is stored between
 * the forward and the backward, and every (re)computation of a step redraws the same mask.
 *
 *   aten.native_dropout(input, p, train=True) -> (out, mask)
 *       et_dropout_forward(count, input, et_dropout_stream(seed, step, key), threshold, scale, out)
 *   aten.native_dropout_backward(grad_output, mask, scale) -> gx
 *       et_dropout_backward(count, grad_output, et_dropout_stream(seed, step, key), threshold, scale, gx)
 *
 * The mask (the one definition; compiler/frontend/dropout_mask.py mirrors it for the exactness reference):
 *   fmix(h)  = murmur3's 32-bit finalizer
 *   stream   = fmix(fmix(fmix(seed) ^ step) ^ key)        key: CRC-32 of the dropout's module name
 *   r_i      = fmix(stream ^ (i * 0x9E3779B9)) >> 8        a 24-bit uniform, u_i = r_i / 2^24
 *   keep_i   = r_i >= threshold                            threshold = ceil(p * 2^24): u_i >= p, in integers
 *   out_i    = x_i * keep_i * scale                        keep_i as 0.0f / 1.0f, scale = (float)(1 / (1 - p))
 *   gx_i     = gy_i * keep_i * scale                       (scale 0 when p == 1, as torch)
 * All arithmetic is uint32 with wrap-around. The products round as torch's input * mask * scale and
 * grad * mask * scale do (a kept element is x * scale exactly). In place is allowed.
 */
#ifndef ET_DROPOUT_H
#define ET_DROPOUT_H

#include <stdint.h>

uint32_t et_dropout_stream(uint32_t seed, uint32_t step, uint32_t key);
int et_dropout_keep(uint32_t stream, uint32_t i, uint32_t threshold);

void et_dropout_forward(int count, const float *x, uint32_t stream, uint32_t threshold, float scale, float *y);
void et_dropout_backward(int count, const float *gy, uint32_t stream, uint32_t threshold, float scale, float *gx);

#endif /* ET_DROPOUT_H */
