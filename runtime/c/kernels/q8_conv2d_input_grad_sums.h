/*
 * q8_conv2d_input_grad_sums.h - an int8 convolution's input gradient as its exact int32 sums (layouts as
 * q8_conv2d.h): acc[n][ic][ih][iw] = sum over the output channels of ic's group and the kernel taps that read the
 * pixel of gy * w, the sums et_q8_conv2d_backward_input requantises. int8 bias training quantises them by their own
 * largest magnitude (et_q8_sums_quantize), which a fixed per-channel requantisation cannot. A plain loop.
 */
#ifndef ET_Q8_CONV2D_INPUT_GRAD_SUMS_H
#define ET_Q8_CONV2D_INPUT_GRAD_SUMS_H

#include <stdint.h>

#include "conv2d.h"

void et_q8_conv2d_backward_input_sums(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, int32_t *acc);

/* The output index o (of `out`) whose tap k reads input index i, or -1: i = o*stride - pad + k*dil. */
static inline int et_q8_tap_source(int i, int k, int stride, int pad, int dil, int out)
{
    const int t = i + pad - k * dil;

    if (t < 0 || t % stride != 0 || t / stride >= out)
        return -1;
    return t / stride;
}

/* One input pixel's exact sum (n, ic, ih, iw): the definition both this kernel and the requantising reference
 * kernel (q8_conv2d_input_grad.c) compute. */
static inline int32_t et_q8_input_grad_sum(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, int n, int ic,
                                           int ih, int iw)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int g = ic / cin_g, icg = ic % cin_g;
    int32_t sum = 0;
    int ocg, kh, kw;

    for (ocg = 0; ocg < cout_g; ++ocg) {
        const int oc = g * cout_g + ocg;
        for (kh = 0; kh < s->k_h; ++kh) {
            const int oh = et_q8_tap_source(ih, kh, s->stride_h, s->pad_h, s->dil_h, s->h_out);
            if (oh < 0)
                continue;
            for (kw = 0; kw < s->k_w; ++kw) {
                const int ow = et_q8_tap_source(iw, kw, s->stride_w, s->pad_w, s->dil_w, s->w_out);
                if (ow < 0)
                    continue;
                sum += gy[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow] *
                       w[(((long)oc * cin_g + icg) * s->k_h + kh) * s->k_w + kw];
            }
        }
    }
    return sum;
}

#endif /* ET_Q8_CONV2D_INPUT_GRAD_SUMS_H */
