/* q8_maxpool2d.c - see q8_maxpool2d.h. */
#include "q8_maxpool2d.h"

#include "q8_arith.h"

void et_q8_maxpool2d_forward(const et_pool2d_shape *s, const int8_t *x, int8_t *y, int32_t *idx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    int p, oh, ow, kh, kw;

    for (p = 0; p < s->n * s->c; ++p) {
        const int8_t *xp = x + p * plane_in;
        for (oh = 0; oh < s->h_out; ++oh)
            for (ow = 0; ow < s->w_out; ++ow) {
                int best = -1;
                for (kh = 0; kh < s->k_h; ++kh) {
                    const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
                    if (ih < 0 || ih >= s->h_in)
                        continue;
                    for (kw = 0; kw < s->k_w; ++kw) {
                        const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
                        if (iw >= 0 && iw < s->w_in && (best < 0 || xp[ih * s->w_in + iw] > xp[best]))
                            best = ih * s->w_in + iw;
                    }
                }
                y[p * plane_out + (long)oh * s->w_out + ow] = xp[best];
                idx[p * plane_out + (long)oh * s->w_out + ow] = best;
            }
    }
}

/* Windows that cannot overlap (stride >= the dilated kernel): each input takes at most one gradient, placed at
 * its argmax. Otherwise, per input element, the outputs whose window covers it (a gather: one int32 sum,
 * saturated once). */
void et_q8_maxpool2d_backward(const et_pool2d_shape *s, const int8_t *gy, const int32_t *idx, int8_t *gx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    int p, ih, iw, kh, kw;
    long i;

    if (s->stride_h >= (s->k_h - 1) * s->dil_h + 1 && s->stride_w >= (s->k_w - 1) * s->dil_w + 1) {
        for (i = 0; i < (long)s->n * s->c * plane_in; ++i)
            gx[i] = 0;
        for (p = 0; p < s->n * s->c; ++p)
            for (i = 0; i < plane_out; ++i)
                gx[p * plane_in + idx[p * plane_out + i]] = gy[p * plane_out + i];
        return;
    }
    for (p = 0; p < s->n * s->c; ++p)
        for (ih = 0; ih < s->h_in; ++ih)
            for (iw = 0; iw < s->w_in; ++iw) {
                const int32_t me = ih * s->w_in + iw;
                int32_t acc = 0;
                for (kh = 0; kh < s->k_h; ++kh) {
                    const int th = ih + s->pad_h - kh * s->dil_h;
                    if (th < 0 || th % s->stride_h != 0 || th / s->stride_h >= s->h_out)
                        continue;
                    for (kw = 0; kw < s->k_w; ++kw) {
                        const int tw = iw + s->pad_w - kw * s->dil_w;
                        long o;
                        if (tw < 0 || tw % s->stride_w != 0 || tw / s->stride_w >= s->w_out)
                            continue;
                        o = p * plane_out + (long)(th / s->stride_h) * s->w_out + tw / s->stride_w;
                        if (idx[o] == me)
                            acc += gy[o];
                    }
                }
                gx[p * plane_in + me] = et_q8_sat8(acc);
            }
}
