/* q8_conv2d.c - see q8_conv2d.h. */
#include "q8_conv2d.h"

#include <stddef.h>

int et_q8_conv2d_col_bytes(const et_conv2d_shape *s)
{
    return s->c_in / s->groups * s->k_h * s->k_w;
}

void et_q8_conv2d_forward_ref(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                              const int32_t *bias, const et_q8_requant *q, int8_t *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    int n, oc, oh, ow, icg, kh, kw;

    for (n = 0; n < s->n; ++n)
        for (oc = 0; oc < s->c_out; ++oc) {
            const int ic0 = oc / cout_g * cin_g;
            for (oh = 0; oh < s->h_out; ++oh)
                for (ow = 0; ow < s->w_out; ++ow) {
                    int32_t acc = bias != NULL ? bias[oc] : 0;
                    for (icg = 0; icg < cin_g; ++icg)
                        for (kh = 0; kh < s->k_h; ++kh) {
                            const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
                            if (ih < 0 || ih >= s->h_in)
                                continue; /* padding: (x_zp - x_zp) * w adds nothing */
                            for (kw = 0; kw < s->k_w; ++kw) {
                                const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
                                if (iw < 0 || iw >= s->w_in)
                                    continue;
                                acc += (x[(((long)n * s->c_in + ic0 + icg) * s->h_in + ih) * s->w_in + iw] - x_zp) *
                                       w[(((long)oc * cin_g + icg) * s->k_h + kh) * s->k_w + kw];
                            }
                        }
                    y[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow] = et_q8_output(q, oc, acc);
                }
        }
}

#if ET_Q8_FAST
/* One output pixel's window of group g as a row of `col`, in w's (icg, kh, kw) order; padding is x_zp. */
static void gather_window(const et_conv2d_shape *s, const int8_t *xg, int8_t pad, int oh, int ow, int8_t *col)
{
    const int cin_g = s->c_in / s->groups;
    const long plane = (long)s->h_in * s->w_in;
    int icg, kh, kw;

    for (kh = 0; kh < s->k_h; ++kh) {
        const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
        for (kw = 0; kw < s->k_w; ++kw) {
            const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
            const int inside = ih >= 0 && ih < s->h_in && iw >= 0 && iw < s->w_in;
            const int8_t *src = xg + (long)ih * s->w_in + iw;
            int8_t *dst = col + kh * s->k_w + kw;
            for (icg = 0; icg < cin_g; ++icg)
                dst[icg * s->k_h * s->k_w] = inside ? src[icg * plane] : pad;
        }
    }
}

/* Each output pixel's window gathered once into `col`, then dotted with the weight rows of its group,
 * four output channels at a time (et_q8_dot4_rows: the window unpacked once for four rows). */
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int8_t *col, int8_t *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, len = et_q8_conv2d_col_bytes(s);
    const long plane_out = (long)s->h_out * s->w_out;
    int n, g, oh, ow, ocg;

    for (n = 0; n < s->n; ++n)
        for (g = 0; g < s->groups; ++g) {
            const int8_t *xg = x + ((long)n * s->c_in + (long)g * cin_g) * s->h_in * s->w_in;
            int8_t *yg = y + ((long)n * s->c_out + (long)g * cout_g) * plane_out;
            for (oh = 0; oh < s->h_out; ++oh)
                for (ow = 0; ow < s->w_out; ++ow) {
                    const long p = (long)oh * s->w_out + ow;
                    gather_window(s, xg, (int8_t)x_zp, oh, ow, col);
                    for (ocg = 0; ocg + 4 <= cout_g; ocg += 4) {
                        const int oc = g * cout_g + ocg;
                        const int8_t *w0 = w + (long)oc * len;
                        int32_t acc[4];
                        int j;
                        for (j = 0; j < 4; ++j)
                            acc[j] = bias != NULL ? bias[oc + j] : 0;
                        et_q8_dot4_rows(col, -x_zp, w0, w0 + len, w0 + 2 * len, w0 + 3 * len, len, acc);
                        for (j = 0; j < 4; ++j)
                            yg[(ocg + j) * plane_out + p] = et_q8_output(q, oc + j, acc[j]);
                    }
                    for (; ocg < cout_g; ++ocg) { /* channels left over from blocks of 4 (depthwise: all) */
                        const int oc = g * cout_g + ocg;
                        const int32_t acc = et_q8_dot(col, -x_zp, w + (long)oc * len, len, bias != NULL ? bias[oc] : 0);
                        yg[ocg * plane_out + p] = et_q8_output(q, oc, acc);
                    }
                }
        }
}
#else
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int8_t *col, int8_t *y)
{
    (void)col;
    et_q8_conv2d_forward_ref(s, x, x_zp, w, bias, q, y);
}
#endif
