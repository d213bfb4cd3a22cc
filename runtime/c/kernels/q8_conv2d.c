/* q8_conv2d.c - see q8_conv2d.h. */
#include "q8_conv2d.h"

#include <stddef.h>

#include "conv2d_geometry.h"

int et_q8_conv2d_scratch_size(const et_conv2d_shape *s)
{
    return 2 * (s->c_in / s->groups * s->k_h * s->k_w); /* two output pixels' windows */
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
/* Output pixel p's window of group g as int16 x - x_zp (0 in the padding), in w's (icg, kh, kw) order with each
 * quad stored as et_q8_col_pos says (QUAD_STEP: where element j goes relative to j). */
static const int8_t QUAD_STEP[4] = {0, 1, -1, 0};

static void gather_window(const et_conv2d_shape *s, const int8_t *xg, int32_t x_zp, long p, int16_t *col)
{
    const int cin_g = s->c_in / s->groups, len = cin_g * s->k_h * s->k_w, len4 = len & ~3;
    const int ih0 = (int)(p / s->w_out) * s->stride_h - s->pad_h, iw0 = (int)(p % s->w_out) * s->stride_w - s->pad_w;
    const int inside = ih0 >= 0 && iw0 >= 0 && ih0 + (s->k_h - 1) * s->dil_h < s->h_in &&
                       iw0 + (s->k_w - 1) * s->dil_w < s->w_in;
    const long plane = (long)s->h_in * s->w_in;
    int icg, kh, kw, j = 0;

    for (icg = 0; icg < cin_g; ++icg)
        for (kh = 0; kh < s->k_h; ++kh) {
            const int ih = ih0 + kh * s->dil_h;
            const int8_t *row = xg + icg * plane + (long)ih * s->w_in + iw0;
            for (kw = 0; kw < s->k_w; ++kw, ++j) {
                const int iw = iw0 + kw * s->dil_w;
                const int v = inside || (ih >= 0 && ih < s->h_in && iw >= 0 && iw < s->w_in) ? row[kw * s->dil_w] - x_zp : 0;
                col[j < len4 ? j + QUAD_STEP[j & 3] : j] = (int16_t)v;
            }
        }
}

#define DW_MAX_KH 8 /* kernel rows the depthwise path keeps packed in registers (taller kernels: plain loop) */

/* Depthwise (one input channel per group) with 3-wide kernel rows, dilation 1 along w: each kernel row of a pixel
 * is one et_q8_row3 (no gather), the rows' weights packed once per channel. A pixel whose first or last tap
 * falls off the row takes the packing with that tap's weight 0: the byte it reads there (inside the tensor,
 * which the pointer checks keep) is multiplied by 0. Other pixels sum their inside taps one by one. */
static void depthwise3(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                       const int32_t *bias, const et_q8_requant *q, int8_t *y)
{
    const int cout_g = s->c_out / s->groups;
    const uint32_t off = et_q8_dup16(-x_zp);
    const long x_size = (long)s->n * s->c_in * s->h_in * s->w_in;
    uint32_t w02[3][DW_MAX_KH]; /* all taps; tap 0 off the row; tap 2 off the row */
    int32_t w1[DW_MAX_KH];
    int n, oc, oh, ow, kh, kw, kh0, kh1;

    for (n = 0; n < s->n; ++n)
        for (oc = 0; oc < s->c_out; ++oc) {
            const long xc = ((long)n * s->c_in + oc / cout_g) * s->h_in * s->w_in; /* the channel's plane */
            const int8_t *wc = w + (long)oc * s->k_h * 3;
            int8_t *yc = y + ((long)n * s->c_out + oc) * s->h_out * s->w_out;
            const int32_t b = bias != NULL ? bias[oc] : 0;
            for (kh = 0; kh < s->k_h; ++kh) {
                w02[0][kh] = et_q8_pack_lo((uint32_t)wc[3 * kh], (uint32_t)wc[3 * kh + 2]);
                w02[1][kh] = et_q8_pack_lo(0u, (uint32_t)wc[3 * kh + 2]);
                w02[2][kh] = et_q8_pack_lo((uint32_t)wc[3 * kh], 0u);
                w1[kh] = wc[3 * kh + 1];
            }
            for (oh = 0; oh < s->h_out; ++oh) {
                const int ih0 = oh * s->stride_h - s->pad_h;
                int8_t *yr = yc + (long)oh * s->w_out;
                tap_range(ih0, s->dil_h, s->k_h, s->h_in, &kh0, &kh1);
                for (ow = 0; ow < s->w_out; ++ow) {
                    const int iw0 = ow * s->stride_w - s->pad_w;
                    const long first = xc + (long)(ih0 + kh0 * s->dil_h) * s->w_in + iw0; /* x's index */
                    const long last = first + (long)(kh1 - 1 - kh0) * s->dil_h * s->w_in + 3; /* the last byte read */
                    const int side = iw0 < 0 ? 1 : iw0 + 2 >= s->w_in ? 2 : 0;
                    const int8_t *xr;
                    int32_t acc = b;
                    if (kh0 < kh1 && iw0 >= -1 && iw0 + 1 < s->w_in && !(iw0 < 0 && iw0 + 2 >= s->w_in) &&
                        first >= 0 && last < x_size) {
                        const uint32_t *wp = w02[side];
                        xr = x + first;
                        for (kh = kh0; kh < kh1; ++kh, xr += (long)s->dil_h * s->w_in)
                            acc = et_q8_row3(xr, off, wp[kh], w1[kh], acc);
                    } else
                        for (kh = kh0; kh < kh1; ++kh)
                            for (kw = 0; kw < 3; ++kw)
                                if (iw0 + kw >= 0 && iw0 + kw < s->w_in)
                                    acc += (x[xc + (long)(ih0 + kh * s->dil_h) * s->w_in + iw0 + kw] - x_zp) *
                                           wc[3 * kh + kw];
                    yr[ow] = et_q8_output(q, oc, acc);
                }
            }
        }
}

/* Two output pixels' windows gathered once (int16, zero point subtracted), then two output channels at a time
 * against them (et_q8_mac_2x2: sixteen multiply-adds per eight SMLADs); an odd pixel or channel reuses the
 * block with the same column or row twice. */
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int16_t *scratch, int8_t *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, len = cin_g * s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    int n, g, ocg;
    long p;

    if (cin_g == 1 && s->k_w == 3 && s->dil_w == 1 && s->k_h <= DW_MAX_KH) {
        depthwise3(s, x, x_zp, w, bias, q, y);
        return;
    }
    for (n = 0; n < s->n; ++n)
        for (g = 0; g < s->groups; ++g) {
            const int8_t *xg = x + ((long)n * s->c_in + (long)g * cin_g) * s->h_in * s->w_in;
            int8_t *yg = y + ((long)n * s->c_out + (long)g * cout_g) * plane_out;
            for (p = 0; p < plane_out; p += 2) {
                const int two = p + 1 < plane_out;
                int16_t *c0 = scratch, *c1 = two ? scratch + len : scratch;
                gather_window(s, xg, x_zp, p, c0);
                if (two)
                    gather_window(s, xg, x_zp, p + 1, c1);
                for (ocg = 0; ocg < cout_g; ocg += 2) {
                    const int oc = g * cout_g + ocg, rows = ocg + 1 < cout_g ? 2 : 1;
                    const int8_t *w0 = w + (long)oc * len;
                    const int32_t b0 = bias != NULL ? bias[oc] : 0, b1 = bias != NULL && rows == 2 ? bias[oc + 1] : 0;
                    int32_t acc[4];
                    int8_t *yp = yg + ocg * plane_out + p;
                    acc[0] = acc[1] = b0;
                    acc[2] = acc[3] = b1;
                    et_q8_mac_2x2(c0, c1, w0, rows == 2 ? w0 + len : w0, len, acc);
                    yp[0] = et_q8_output(q, oc, acc[0]);
                    if (two)
                        yp[1] = et_q8_output(q, oc, acc[1]);
                    if (rows == 2) {
                        yp[plane_out] = et_q8_output(q, oc + 1, acc[2]);
                        if (two)
                            yp[plane_out + 1] = et_q8_output(q, oc + 1, acc[3]);
                    }
                }
            }
        }
}
#else
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int16_t *scratch, int8_t *y)
{
    (void)scratch;
    et_q8_conv2d_forward_ref(s, x, x_zp, w, bias, q, y);
}
#endif
