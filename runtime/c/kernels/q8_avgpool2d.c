/* q8_avgpool2d.c - see q8_avgpool2d.h. */
#include "q8_avgpool2d.h"

#include <string.h>

#include "q8_arith.h"

/* Output (oh, ow)'s window inside the input, [h0, h1) x [w0, w1), and torch's divisor for it. */
static inline int32_t window(const et_pool2d_shape *s, int oh, int ow, int *h0, int *h1, int *w0, int *w1)
{
    int a = oh * s->stride_h - s->pad_h, b = ow * s->stride_w - s->pad_w;
    int a1 = a + s->k_h < s->h_in + s->pad_h ? a + s->k_h : s->h_in + s->pad_h;
    int b1 = b + s->k_w < s->w_in + s->pad_w ? b + s->k_w : s->w_in + s->pad_w;
    const int32_t padded = (a1 - a) * (b1 - b);

    *h0 = a > 0 ? a : 0;
    *w0 = b > 0 ? b : 0;
    *h1 = a1 < s->h_in ? a1 : s->h_in;
    *w1 = b1 < s->w_in ? b1 : s->w_in;
    if (*h1 <= *h0 || *w1 <= *w0)
        return padded > 0 ? padded : 1; /* all padding: the sum is 0 whatever the divisor */
    return s->count_include_pad ? padded : (*h1 - *h0) * (*w1 - *w0);
}

/* round(v / d), halves away from zero, d > 0 */
static int32_t rounding_div(int32_t v, int32_t d)
{
    return v >= 0 ? (v + d / 2) / d : -((-v + d / 2) / d);
}

void et_q8_avgpool2d_forward(const et_pool2d_shape *s, const int8_t *x, int32_t zp, int8_t *y)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    int p, oh, ow, ih, iw, h0, h1, w0, w1;

    for (p = 0; p < s->n * s->c; ++p)
        for (oh = 0; oh < s->h_out; ++oh)
            for (ow = 0; ow < s->w_out; ++ow) {
                const int32_t d = window(s, oh, ow, &h0, &h1, &w0, &w1);
                int32_t acc = 0;
                for (ih = h0; ih < h1; ++ih)
                    for (iw = w0; iw < w1; ++iw)
                        acc += x[p * plane_in + (long)ih * s->w_in + iw] - zp;
                y[p * plane_out + (long)oh * s->w_out + ow] = et_q8_sat8(zp + rounding_div(acc, d));
            }
}

/* The outputs o in [*lo, *hi) whose window [o*stride - pad, o*stride - pad + k) holds input index i. */
static void covering(int i, int k, int stride, int pad, int out, int *lo, int *hi)
{
    const int t = i + pad - k + 1; /* o*stride >= t */

    *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
    *hi = (i + pad) / stride + 1;
    *hi = *hi < out ? *hi : out;
}

void et_q8_avgpool2d_backward_ref(const et_pool2d_shape *s, const int8_t *gy, int8_t *gx)
{
    const long plane_in = (long)s->h_in * s->w_in, plane_out = (long)s->h_out * s->w_out;
    int p, ih, iw, oh, ow, oh0, oh1, ow0, ow1, h0, h1, w0, w1;

    for (p = 0; p < s->n * s->c; ++p)
        for (ih = 0; ih < s->h_in; ++ih) {
            covering(ih, s->k_h, s->stride_h, s->pad_h, s->h_out, &oh0, &oh1);
            for (iw = 0; iw < s->w_in; ++iw) {
                int32_t acc = 0;
                covering(iw, s->k_w, s->stride_w, s->pad_w, s->w_out, &ow0, &ow1);
                for (oh = oh0; oh < oh1; ++oh)
                    for (ow = ow0; ow < ow1; ++ow) {
                        const int32_t d = window(s, oh, ow, &h0, &h1, &w0, &w1);
                        acc += gy[p * plane_out + (long)oh * s->w_out + ow] * ((32768 + d / 2) / d);
                    }
                gx[p * plane_in + (long)ih * s->w_in + iw] = et_q8_sat8(et_q8_rounding_rshift(acc, 15));
            }
        }
}

/* Windows that cannot overlap (stride >= kernel, both ways): each input element is inside at most one window, so its
 * sum is one term: each output's gy * r, rounded right by 15 once, is written over its window's inside (one divisor
 * per output instead of one per input and covering output), and the elements no window covers are 0. Overlapping
 * windows take the plain loop. */
void et_q8_avgpool2d_backward(const et_pool2d_shape *s, const int8_t *gy, int8_t *gx)
{
    const int h_in = s->h_in, w_in = s->w_in, h_out = s->h_out, w_out = s->w_out, planes = s->n * s->c;
    const long plane_in = (long)h_in * w_in, plane_out = (long)h_out * w_out;
    int p, oh, ow, ih, iw, h0, h1, w0, w1;

    if (s->stride_h < s->k_h || s->stride_w < s->k_w) {
        et_q8_avgpool2d_backward_ref(s, gy, gx);
        return;
    }
    if (s->stride_h > s->k_h || s->stride_w > s->k_w || s->pad_h > 0 || s->pad_w > 0 || h_out * s->stride_h < h_in ||
        w_out * s->stride_w < w_in)
        memset(gx, 0, (size_t)(planes * plane_in)); /* some elements no window covers */
    for (oh = 0; oh < h_out; ++oh)
        for (ow = 0; ow < w_out; ++ow) {
            const int32_t d = window(s, oh, ow, &h0, &h1, &w0, &w1), r = (32768 + d / 2) / d;
            const int8_t *g = gy + (long)oh * w_out + ow;
            int8_t *x0 = gx + (long)h0 * w_in + w0;
            const int rows = h1 > h0 && w1 > w0 ? h1 - h0 : 0, cols = w1 - w0;
            for (p = 0; p < planes; ++p, g += plane_out, x0 += plane_in) {
                const int8_t v = et_q8_sat8(et_q8_rounding_rshift(*g * r, 15));
                int8_t *row = x0;
                /* one loop over the window, not a loop per row (which gcc makes a memset call: slow for 2 bytes) */
                for (ih = 0, iw = 0; ih < rows; ) {
                    row[iw] = v;
                    if (++iw == cols) {
                        iw = 0;
                        ++ih;
                        row += w_in;
                    }
                }
            }
        }
}
