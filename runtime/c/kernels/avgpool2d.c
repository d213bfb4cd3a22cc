/* avgpool2d.c - see avgpool2d.h. */
#include "avgpool2d.h"

#include <stddef.h>

#include "../et_status.h"

int et_avgpool2d_shape_check(const et_pool2d_shape *s)
{
    if (s == NULL || s->n <= 0 || s->c <= 0 || s->h_in <= 0 || s->w_in <= 0 || s->h_out <= 0 ||
        s->w_out <= 0 || s->k_h <= 0 || s->k_w <= 0 || s->stride_h <= 0 || s->stride_w <= 0 ||
        s->pad_h < 0 || s->pad_w < 0 || s->dil_h != 1 || s->dil_w != 1)
        return ET_ERR_ARG;
    if (2 * s->pad_h > s->k_h || 2 * s->pad_w > s->k_w)
        return ET_ERR_ARG; /* torch: pad should be at most half of the kernel size */
    return ET_OK;
}

/* The window of output (oh, ow), clipped to the input, and the divisor torch uses for it. Returns 0 for
 * a window that lies entirely in the padding (its output is 0, its gradient dropped). */
static int avg_window(const et_pool2d_shape *s, int oh, int ow, int *ih0, int *ih1, int *iw0, int *iw1,
                      int *divisor)
{
    int h0 = oh * s->stride_h - s->pad_h, w0 = ow * s->stride_w - s->pad_w;
    /* End clipped to the padded input first: that is the window counted with count_include_pad. */
    int h1 = h0 + s->k_h < s->h_in + s->pad_h ? h0 + s->k_h : s->h_in + s->pad_h;
    int w1 = w0 + s->k_w < s->w_in + s->pad_w ? w0 + s->k_w : s->w_in + s->pad_w;
    const int padded_size = (h1 - h0) * (w1 - w0);

    h0 = h0 > 0 ? h0 : 0;
    w0 = w0 > 0 ? w0 : 0;
    h1 = h1 < s->h_in ? h1 : s->h_in;
    w1 = w1 < s->w_in ? w1 : s->w_in;
    if (h0 >= h1 || w0 >= w1)
        return 0;
    *ih0 = h0;
    *ih1 = h1;
    *iw0 = w0;
    *iw1 = w1;
    *divisor = s->count_include_pad ? padded_size : (h1 - h0) * (w1 - w0);
    return 1;
}

/* Outputs [*lo, *hi) along one axis whose window (k taps from o*stride - pad) lies wholly inside [0, in):
 * there the window needs no clipping and its divisor is the full k_h * k_w (with or without padding). */
static void interior(int k, int stride, int pad, int in, int out, int *lo, int *hi)
{
    const int a = (pad + stride - 1) / stride;
    int b = in - k + pad < 0 ? 0 : (in - k + pad) / stride + 1;

    b = b < out ? b : out;
    *lo = a < b ? a : b;
    *hi = b;
}

/* The window of output (oh, ow): the interior's directly, the border's through avg_window. */
static int window(const et_pool2d_shape *s, int oh, int ow, int inside, int *ih0, int *ih1, int *iw0, int *iw1,
                  int *divisor)
{
    if (!inside)
        return avg_window(s, oh, ow, ih0, ih1, iw0, iw1, divisor);
    *ih0 = oh * s->stride_h - s->pad_h;
    *iw0 = ow * s->stride_w - s->pad_w;
    *ih1 = *ih0 + s->k_h;
    *iw1 = *iw0 + s->k_w;
    *divisor = s->k_h * s->k_w;
    return 1;
}

void et_avgpool2d_forward(const et_pool2d_shape *s, const float *x, float *y)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    long p;
    int oh, ow, ih, iw, ih0, ih1, iw0, iw1, divisor, oh_lo, oh_hi, ow_lo, ow_hi;

    interior(s->k_h, s->stride_h, s->pad_h, s->h_in, s->h_out, &oh_lo, &oh_hi);
    interior(s->k_w, s->stride_w, s->pad_w, s->w_in, s->w_out, &ow_lo, &ow_hi);
    for (p = 0; p < (long)s->n * s->c; ++p) {
        const float *xp = x + p * plane_in;
        float *yp = y + p * plane_out;
        for (oh = 0; oh < s->h_out; ++oh) {
            for (ow = 0; ow < s->w_out; ++ow) {
                float sum = 0.0f;
                const int inside = oh >= oh_lo && oh < oh_hi && ow >= ow_lo && ow < ow_hi;
                if (!window(s, oh, ow, inside, &ih0, &ih1, &iw0, &iw1, &divisor)) {
                    yp[oh * s->w_out + ow] = 0.0f;
                    continue;
                }
                for (ih = ih0; ih < ih1; ++ih)
                    for (iw = iw0; iw < iw1; ++iw)
                        sum += xp[ih * s->w_in + iw];
                yp[oh * s->w_out + ow] = sum / (float)divisor;
            }
        }
    }
}

void et_avgpool2d_backward(const et_pool2d_shape *s, const float *gy, float *gx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    long p, i;
    int oh, ow, ih, iw, ih0, ih1, iw0, iw1, divisor, oh_lo, oh_hi, ow_lo, ow_hi;

    interior(s->k_h, s->stride_h, s->pad_h, s->h_in, s->h_out, &oh_lo, &oh_hi);
    interior(s->k_w, s->stride_w, s->pad_w, s->w_in, s->w_out, &ow_lo, &ow_hi);
    for (i = 0; i < (long)s->n * s->c * plane_in; ++i)
        gx[i] = 0.0f;
    for (p = 0; p < (long)s->n * s->c; ++p) {
        const float *gyp = gy + p * plane_out;
        float *gxp = gx + p * plane_in;
        for (oh = 0; oh < s->h_out; ++oh) {
            for (ow = 0; ow < s->w_out; ++ow) {
                float delta;
                const int inside = oh >= oh_lo && oh < oh_hi && ow >= ow_lo && ow < ow_hi;
                if (!window(s, oh, ow, inside, &ih0, &ih1, &iw0, &iw1, &divisor))
                    continue;
                delta = gyp[oh * s->w_out + ow] / (float)divisor;
                for (ih = ih0; ih < ih1; ++ih)
                    for (iw = iw0; iw < iw1; ++iw)
                        gxp[ih * s->w_in + iw] += delta;
            }
        }
    }
}
