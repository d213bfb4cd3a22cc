/* q8_conv2d.c - see q8_conv2d.h. */
#include "q8_conv2d.h"

#include <stddef.h>

#include "conv2d_geometry.h"
#include "q8_window.h"

int et_q8_conv2d_scratch_size(const et_conv2d_shape *s)
{
    const int len = s->c_in / s->groups * s->k_h * s->k_w;
    return 2 * len + (len + 4) / 2; /* two output pixels' windows (int16), then one window's bytes */
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
/* Output pixel p's window of group g as int16 x - x_zp (0 in the padding), in w's (icg, kh, kw) order, written as
 * slot k (0 or 1) of a two-pixel column: quad q of the window at col[8q + 4k ..], stored (0, 2, 1, 3) - the words an
 * SXTB16 of four weights and its rotation pair with - and an element j past the last quad at col[2j + k]. The
 * window's bytes are copied first (et_q8_window_bytes: x_zp in the padding, a real 0) into `bytes`, then widened a
 * quad at a time: SXTAB16 of a word gives its elements 0 and 2, the rotated one 1 and 3. */
static void gather_window(const et_conv2d_shape *s, const int8_t *xg, int32_t x_zp, long p, int8_t *bytes, int16_t *col,
                          int k)
{
    const int len = s->c_in / s->groups * s->k_h * s->k_w;
    const uint32_t off = et_q8_dup16(-x_zp);
    int j;

    et_q8_window_bytes(s, xg, x_zp, (int)(p / s->w_out) * s->stride_h - s->pad_h,
                       (int)(p % s->w_out) * s->stride_w - s->pad_w, bytes);
    for (j = 0; j + 4 <= len; j += 4) {
        const uint32_t v = et_q8_load4(bytes + j);
        const uint32_t even = et_q8_sxtab16(off, v), odd = et_q8_sxtab16_ror8(off, v);
        memcpy(col + 2 * j + 4 * k, &even, 4);
        memcpy(col + 2 * j + 4 * k + 2, &odd, 4);
    }
    for (; j < len; ++j)
        col[2 * j + k] = (int16_t)(bytes[j] - x_zp);
}

/* acc[2r + k] += sum_i w_r[i] * (pixel k's element i) for weight rows w_0, w_1 against a two-pixel column
 * (gather_window's layout): per quad, two weight words unpacked once and the column's four consecutive words serve
 * eight SMLADs (sixteen multiply-adds), with one pointer walking the column. */
static void mac_2x2_pairs(const int16_t *col, const int8_t *w0, const int8_t *w1, int len, int32_t acc[4])
{
    int32_t s00 = acc[0], s01 = acc[1], s10 = acc[2], s11 = acc[3];
    int i;

    for (i = 0; i + 4 <= len; i += 4, col += 8) {
        const uint32_t a = et_q8_load4(w0 + i), b = et_q8_load4(w1 + i);
        const uint32_t x0e = et_q8_load2x16(col), x0o = et_q8_load2x16(col + 2);
        const uint32_t x1e = et_q8_load2x16(col + 4), x1o = et_q8_load2x16(col + 6);
        const uint32_t ae = et_q8_sxtb16(a), ao = et_q8_sxtb16_ror8(a);
        const uint32_t be = et_q8_sxtb16(b), bo = et_q8_sxtb16_ror8(b);
        s00 = et_q8_smlad(ae, x0e, s00);
        s00 = et_q8_smlad(ao, x0o, s00);
        s01 = et_q8_smlad(ae, x1e, s01);
        s01 = et_q8_smlad(ao, x1o, s01);
        s10 = et_q8_smlad(be, x0e, s10);
        s10 = et_q8_smlad(bo, x0o, s10);
        s11 = et_q8_smlad(be, x1e, s11);
        s11 = et_q8_smlad(bo, x1o, s11);
    }
    for (; i < len; ++i, col += 2) {
        s00 += w0[i] * col[0];
        s01 += w0[i] * col[1];
        s10 += w1[i] * col[0];
        s11 += w1[i] * col[1];
    }
    acc[0] = s00;
    acc[1] = s01;
    acc[2] = s10;
    acc[3] = s11;
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

/* Output channels oc0 .. oc0 + count - 1 of two pixels (their two-pixel column; yp0 and yp1 their outputs of channel
 * oc0, yp1 NULL for a missing second pixel), two channels per mac_2x2_pairs (a lone last one reuses its row). */
ET_Q8_NOINLINE static void channel_blocks(const int16_t *col, const int8_t *w, int len, const int32_t *bias,
                           const et_q8_requant *q, int oc0, int count, long plane_out, int8_t *yp0, int8_t *yp1)
{
    int k;

    for (k = 0; k < count; k += 2, yp0 += 2 * plane_out, yp1 = yp1 != NULL ? yp1 + 2 * plane_out : NULL) {
        const int oc = oc0 + k, two = k + 1 < count;
        const int8_t *w0 = w + (long)oc * len;
        const int32_t b0 = bias != NULL ? bias[oc] : 0, b1 = bias != NULL && two ? bias[oc + 1] : 0;
        int32_t acc[4];
        acc[0] = acc[1] = b0;
        acc[2] = acc[3] = b1;
        mac_2x2_pairs(col, w0, two ? w0 + len : w0, len, acc);
        yp0[0] = et_q8_output(q, oc, acc[0]);
        if (yp1 != NULL)
            yp1[0] = et_q8_output(q, oc, acc[1]);
        if (two) {
            yp0[plane_out] = et_q8_output(q, oc + 1, acc[2]);
            if (yp1 != NULL)
                yp1[plane_out] = et_q8_output(q, oc + 1, acc[3]);
        }
    }
}

/* Two output pixels' windows gathered once into one column (int16, zero point subtracted), then two output channels
 * at a time against them (mac_2x2_pairs: sixteen multiply-adds per eight SMLADs); an odd pixel or channel reuses the
 * block with the same pixel or row twice. */
void et_q8_conv2d_forward(const et_conv2d_shape *s, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int16_t *scratch, int8_t *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, len = cin_g * s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    const et_q8_requant qq = *q; /* a local copy: the int8 stores below may alias *q for the compiler */
    int8_t *bytes = (int8_t *)(scratch + 2 * len);
    int n, g;
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
                gather_window(s, xg, x_zp, p, bytes, scratch, 0);
                gather_window(s, xg, x_zp, two ? p + 1 : p, bytes, scratch, 1);
                channel_blocks(scratch, w, len, bias, &qq, g * cout_g, cout_g, plane_out, yg + p,
                               two ? yg + p + 1 : NULL);
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
