/* maxpool2d.c - see maxpool2d.h. The loops follow PyTorch's cpu_max_pool (NCHW contiguous path). */
#include "maxpool2d.h"

#include <math.h> /* INFINITY */
#include <stddef.h>

#include "../et_status.h"

int et_maxpool2d_shape_check(const et_pool2d_shape *s)
{
    if (s == NULL || s->n <= 0 || s->c <= 0 || s->h_in <= 0 || s->w_in <= 0 || s->h_out <= 0 ||
        s->w_out <= 0 || s->k_h <= 0 || s->k_w <= 0 || s->stride_h <= 0 || s->stride_w <= 0 ||
        s->dil_h <= 0 || s->dil_w <= 0 || s->pad_h < 0 || s->pad_w < 0)
        return ET_ERR_ARG;
    if (2 * s->pad_h > s->dil_h * (s->k_h - 1) + 1 || 2 * s->pad_w > s->dil_w * (s->k_w - 1) + 1)
        return ET_ERR_ARG; /* torch: pad should be at most half of the effective kernel size */
    return ET_OK;
}

/* The maximum of one window - rows ih0, ih0 + dil_h, ... < ih1, columns iw0, ... < iw1, all inside the
 * plane - and its index. torch starts from -inf at the window's first valid element, so an all -inf window
 * still points at a real element; strictly greater: the first maximum wins ties; v != v: a NaN wins. */
static float window_max(const et_pool2d_shape *s, const float *xp, int ih0, int ih1, int iw0, int iw1,
                        int32_t *best)
{
    float best_v = -INFINITY;
    int ih, iw;

    *best = (int32_t)(ih0 * s->w_in + iw0);
    for (ih = ih0; ih < ih1; ih += s->dil_h) {
        const float *xr = xp + (long)ih * s->w_in;
        for (iw = iw0; iw < iw1; iw += s->dil_w) {
            const float v = xr[iw];
            if (v > best_v || v != v) {
                best_v = v;
                *best = (int32_t)(ih * s->w_in + iw);
            }
        }
    }
    return best_v;
}

void et_maxpool2d_forward(const et_pool2d_shape *s, const float *x, float *y, int32_t *idx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    const int span_w = (s->k_w - 1) * s->dil_w + 1;
    /* Interior columns: windows wholly inside the row, [ow_lo, ow_hi); the others are clipped (border). */
    const int ow_lo = (s->pad_w + s->stride_w - 1) / s->stride_w;
    int ow_hi = s->w_in - span_w + s->pad_w < 0 ? 0 : (s->w_in - span_w + s->pad_w) / s->stride_w + 1;
    long p;
    int oh, ow;

    ow_hi = ow_hi < s->w_out ? ow_hi : s->w_out;
    for (p = 0; p < (long)s->n * s->c; ++p) { /* one (sample, channel) plane at a time */
        const float *xp = x + p * plane_in;
        for (oh = 0; oh < s->h_out; ++oh) {
            /* First and one-past-last input row of the window, clipped; padding rows are skipped. */
            int ih0 = oh * s->stride_h - s->pad_h;
            const int ih1 = ih0 + (s->k_h - 1) * s->dil_h + 1 < s->h_in ? ih0 + (s->k_h - 1) * s->dil_h + 1
                                                                         : s->h_in;
            const long o = p * plane_out + (long)oh * s->w_out;
            while (ih0 < 0)
                ih0 += s->dil_h;
            for (ow = 0; ow < s->w_out; ++ow) {
                int iw0 = ow * s->stride_w - s->pad_w, iw1 = iw0 + span_w;
                float v;
                int32_t at;
                if (ow < ow_lo || ow >= ow_hi) { /* border: clip the window's columns */
                    iw1 = iw1 < s->w_in ? iw1 : s->w_in;
                    while (iw0 < 0)
                        iw0 += s->dil_w;
                }
                v = window_max(s, xp, ih0, ih1, iw0, iw1, &at);
                if (idx != NULL)
                    idx[o + ow] = at;
                if (y != NULL)
                    y[o + ow] = v;
            }
        }
    }
}

void et_maxpool2d_gather(const et_pool2d_shape *s, const float *x, const int32_t *idx, float *y)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    long p, o;

    for (p = 0; p < (long)s->n * s->c; ++p)
        for (o = 0; o < plane_out; ++o)
            y[p * plane_out + o] = x[p * plane_in + idx[p * plane_out + o]];
}

void et_maxpool2d_backward(const et_pool2d_shape *s, const float *gy, const int32_t *idx, float *gx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    long p, i;

    for (i = 0; i < (long)s->n * s->c * plane_in; ++i)
        gx[i] = 0.0f;
    /* Overlapping windows (stride < kernel) can pick the same input twice: accumulate, in output order
     * as torch's max_pool2d_with_indices_backward does, so sums round the same way. */
    for (p = 0; p < (long)s->n * s->c; ++p)
        for (i = 0; i < plane_out; ++i)
            gx[p * plane_in + idx[p * plane_out + i]] += gy[p * plane_out + i];
}
