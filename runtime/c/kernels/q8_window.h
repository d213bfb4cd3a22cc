/*
 * q8_window.h - one output pixel's convolution window copied as bytes, shared by the fast int8 convolution
 * kernels that gather windows (q8_conv2d.c's forward, q8_conv2d_weight_grad.c's outer products).
 */
#ifndef ET_Q8_WINDOW_H
#define ET_Q8_WINDOW_H

#include <stdint.h>

#include "conv2d.h"

/* The window of the output pixel whose tap (0, 0) reads input (ih0, iw0), in w's (icg, kh, kw) order, from one
 * group's channels xg: cin_g * k_h * k_w bytes into `bytes`, x_zp (a real 0) in the padding. A window wholly inside
 * the image is copied without a bounds check per element; the shape is read into locals first (every byte stored
 * may alias *s for the compiler, which would reload it). */
static inline void et_q8_window_bytes(const et_conv2d_shape *s, const int8_t *xg, int32_t x_zp, int ih0, int iw0,
                                      int8_t *bytes)
{
    const int cin_g = s->c_in / s->groups, k_h = s->k_h, k_w = s->k_w, dil_h = s->dil_h, dil_w = s->dil_w;
    const int h_in = s->h_in, w_in = s->w_in;
    const long plane = (long)h_in * w_in, row_step = (long)dil_h * w_in;
    int8_t *d = bytes;
    int icg, kh, kw;

    if (ih0 >= 0 && iw0 >= 0 && ih0 + (k_h - 1) * dil_h < h_in && iw0 + (k_w - 1) * dil_w < w_in) {
        const int8_t *xc = xg + (long)ih0 * w_in + iw0;
        if (k_h * k_w == 1) /* pointwise: one byte of each channel's plane */
            for (icg = 0; icg < cin_g; ++icg, xc += plane)
                *d++ = *xc;
        else if (k_w == 3 && dil_w == 1) /* the common 3-wide row */
            for (icg = 0; icg < cin_g; ++icg, xc += plane) {
                const int8_t *row = xc;
                for (kh = 0; kh < k_h; ++kh, row += row_step, d += 3) {
                    d[0] = row[0];
                    d[1] = row[1];
                    d[2] = row[2];
                }
            }
        else
            for (icg = 0; icg < cin_g; ++icg, xc += plane) {
                const int8_t *row = xc;
                for (kh = 0; kh < k_h; ++kh, row += row_step)
                    for (kw = 0; kw < k_w; ++kw)
                        *d++ = row[kw * dil_w];
            }
    } else
        for (icg = 0; icg < cin_g; ++icg)
            for (kh = 0; kh < k_h; ++kh) {
                const int ih = ih0 + kh * dil_h;
                for (kw = 0; kw < k_w; ++kw) {
                    const int iw = iw0 + kw * dil_w;
                    *d++ = ih >= 0 && ih < h_in && iw >= 0 && iw < w_in ? xg[icg * plane + (long)ih * w_in + iw]
                                                                        : (int8_t)x_zp;
                }
            }
}

#endif /* ET_Q8_WINDOW_H */
