/* q8_conv2d_weight_grad.c - see q8_conv2d_weight_grad.h. */
#include "q8_conv2d_weight_grad.h"

#include <stddef.h>

#include "conv2d_geometry.h"


int et_q8_conv2d_weight_grad_scratch_size(const et_conv2d_shape *s)
{
    return 4 * (s->c_in / s->groups * s->k_h * s->k_w); /* four output pixels' windows, interleaved */
}

static void bias_grad(const et_conv2d_shape *s, const int8_t *gy, int32_t *gb)
{
    const long plane = (long)s->h_out * s->w_out;
    int n, oc;
    long p;

    for (oc = 0; oc < s->c_out; ++oc) {
        int32_t acc = 0;
        for (n = 0; n < s->n; ++n)
            for (p = 0; p < plane; ++p)
                acc += gy[((long)n * s->c_out + oc) * plane + p];
        gb[oc] = acc;
    }
}

void et_q8_conv2d_backward_weight_ref(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                      int32_t *gw, int32_t *gb)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    int oc, icg, kh, kw, n, oh, ow;

    for (oc = 0; oc < s->c_out; ++oc) {
        const int ic0 = oc / cout_g * cin_g;
        for (icg = 0; icg < cin_g; ++icg)
            for (kh = 0; kh < s->k_h; ++kh)
                for (kw = 0; kw < s->k_w; ++kw) {
                    int32_t acc = 0;
                    for (n = 0; n < s->n; ++n)
                        for (oh = 0; oh < s->h_out; ++oh) {
                            const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
                            if (ih < 0 || ih >= s->h_in)
                                continue;
                            for (ow = 0; ow < s->w_out; ++ow) {
                                const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
                                if (iw < 0 || iw >= s->w_in)
                                    continue;
                                acc += gy[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow] *
                                       (x[(((long)n * s->c_in + ic0 + icg) * s->h_in + ih) * s->w_in + iw] - x_zp);
                            }
                        }
                    gw[(((long)oc * cin_g + icg) * s->k_h + kh) * s->k_w + kw] = acc;
                }
    }
    if (gb != NULL)
        bias_grad(s, gy, gb);
}

#if ET_Q8_FAST
/* Stride 1 along w: for each kernel tap, the outputs whose tap lands inside the image form one contiguous run per
 * output row, and so do the inputs they read: each run is a dot product of x's row (offset by -x_zp) with gy's
 * rows, four output channels of a group sharing x's unpacking (et_q8_dot4_rows). */
static void by_rows(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp, int32_t *gw)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, taps = s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    int g, ocg, icg, kh, kw, n, oh;

    for (g = 0; g < s->groups; ++g)
        for (ocg = 0; ocg < cout_g; ocg += 4) {
            const int oc = g * cout_g + ocg, rows = cout_g - ocg < 4 ? cout_g - ocg : 4;
            for (icg = 0; icg < cin_g; ++icg)
                for (kh = 0; kh < s->k_h; ++kh)
                    for (kw = 0; kw < s->k_w; ++kw) {
                        int32_t acc[4] = {0, 0, 0, 0};
                        int ow0, ow1, j;
                        interior(kw * s->dil_w - s->pad_w, kw * s->dil_w - s->pad_w, 1, s->w_in, s->w_out, &ow0, &ow1);
                        for (n = 0; n < s->n; ++n)
                            for (oh = 0; oh < s->h_out; ++oh) {
                                const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
                                const int8_t *xr, *g0;
                                if (ih < 0 || ih >= s->h_in || ow0 >= ow1)
                                    continue;
                                xr = x + (((long)n * s->c_in + (long)g * cin_g + icg) * s->h_in + ih) * s->w_in +
                                     ow0 - s->pad_w + kw * s->dil_w;
                                g0 = gy + ((long)n * s->c_out + oc) * plane_out + (long)oh * s->w_out + ow0;
                                if (rows == 4)
                                    et_q8_dot4_rows(xr, -x_zp, g0, g0 + plane_out, g0 + 2 * plane_out,
                                                    g0 + 3 * plane_out, ow1 - ow0, acc);
                                else
                                    for (j = 0; j < rows; ++j)
                                        acc[j] = et_q8_dot(xr, -x_zp, g0 + j * plane_out, ow1 - ow0, acc[j]);
                            }
                        for (j = 0; j < rows; ++j)
                            gw[((long)(oc + j) * cin_g + icg) * taps + kh * s->k_w + kw] = acc[j];
                    }
        }
}

/* Output pixels p .. p+3's windows of group g, interleaved as int16: col[4j + k] = x - x_zp of pixel p + k at
 * window element j (w's (icg, kh, kw) order), 0 in the padding and for pixels past the plane. A word at 4j then
 * holds pixels (p, p+1) and the next one (p+2, p+3): the pairs SMLAD multiplies with their gradients. */
static void gather_quad(const et_conv2d_shape *s, const int8_t *xg, int32_t x_zp, long p, long plane_out, int16_t *col)
{
    const int cin_g = s->c_in / s->groups;
    const long plane = (long)s->h_in * s->w_in;
    int k, icg, kh, kw, j;

    for (k = 0; k < 4; ++k) {
        const int real = p + k < plane_out;
        const int ih0 = real ? (int)((p + k) / s->w_out) * s->stride_h - s->pad_h : 0;
        const int iw0 = real ? (int)((p + k) % s->w_out) * s->stride_w - s->pad_w : 0;
        j = 0;
        for (icg = 0; icg < cin_g; ++icg)
            for (kh = 0; kh < s->k_h; ++kh) {
                const int ih = ih0 + kh * s->dil_h;
                for (kw = 0; kw < s->k_w; ++kw, ++j) {
                    const int iw = iw0 + kw * s->dil_w;
                    col[4 * j + k] = (int16_t)(real && ih >= 0 && ih < s->h_in && iw >= 0 && iw < s->w_in
                                               ? xg[icg * plane + (long)ih * s->w_in + iw] - x_zp : 0);
                }
            }
    }
}

/* Other strides: the weight gradient as a sum of outer products, four output pixels at a time: gw[oc][j] += the
 * four pixels' gradients of oc times their window element j, two SMLADs per accumulator, two output channels
 * sharing the window's loads, gw its own (int32) accumulator. */
static void by_outer_products(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                              int16_t *scratch, int32_t *gw)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, len = cin_g * s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    int n, g, ocg, j, k;
    long p;

    for (j = 0; j < s->c_out * len; ++j)
        gw[j] = 0;
    for (n = 0; n < s->n; ++n)
        for (g = 0; g < s->groups; ++g) {
            const int8_t *xg = x + ((long)n * s->c_in + (long)g * cin_g) * s->h_in * s->w_in;
            const int8_t *gyg = gy + ((long)n * s->c_out + (long)g * cout_g) * plane_out;
            for (p = 0; p < plane_out; p += 4) {
                gather_quad(s, xg, x_zp, p, plane_out, scratch);
                for (ocg = 0; ocg < cout_g; ocg += 2) {
                    const int rows = ocg + 1 < cout_g ? 2 : 1;
                    int32_t g4[2][4];
                    uint32_t a01, a23, b01, b23;
                    int32_t *r0 = gw + ((long)g * cout_g + ocg) * len, *r1 = r0 + (rows == 2 ? len : 0);
                    for (k = 0; k < 4; ++k) {
                        g4[0][k] = p + k < plane_out ? gyg[(long)ocg * plane_out + p + k] : 0;
                        g4[1][k] = p + k < plane_out && rows == 2 ? gyg[(long)(ocg + 1) * plane_out + p + k] : 0;
                    }
                    a01 = et_q8_pack_lo((uint32_t)g4[0][0], (uint32_t)g4[0][1]);
                    a23 = et_q8_pack_lo((uint32_t)g4[0][2], (uint32_t)g4[0][3]);
                    b01 = et_q8_pack_lo((uint32_t)g4[1][0], (uint32_t)g4[1][1]);
                    b23 = et_q8_pack_lo((uint32_t)g4[1][2], (uint32_t)g4[1][3]);
                    for (j = 0; j < len; ++j) {
                        const uint32_t c01 = et_q8_load2x16(scratch + 4 * j), c23 = et_q8_load2x16(scratch + 4 * j + 2);
                        r0[j] = et_q8_smlad(c23, a23, et_q8_smlad(c01, a01, r0[j]));
                        if (rows == 2) /* r1 == r0 for a lone channel: its (zero) b terms are not added twice */
                            r1[j] = et_q8_smlad(c23, b23, et_q8_smlad(c01, b01, r1[j]));
                    }
                }
            }
        }
}

/* Rows where the stride along w is 1; outer products where it is not and a group has 4 or more output channels
 * to share each gathered window; the plain loop otherwise (a depthwise stride-2 layer: gathering would cost
 * more than it saves). */
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int16_t *scratch, int32_t *gw, int32_t *gb)
{
    if (s->stride_w == 1)
        by_rows(s, gy, x, x_zp, gw);
    else if (s->c_out / s->groups >= 4)
        by_outer_products(s, gy, x, x_zp, scratch, gw);
    else {
        et_q8_conv2d_backward_weight_ref(s, gy, x, x_zp, gw, gb);
        return;
    }
    if (gb != NULL)
        bias_grad(s, gy, gb);
}
#else
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int16_t *scratch, int32_t *gw, int32_t *gb)
{
    (void)scratch;
    et_q8_conv2d_backward_weight_ref(s, gy, x, x_zp, gw, gb);
}
#endif
