/* q8_conv2d_weight_grad.c - see q8_conv2d_weight_grad.h. */
#include "q8_conv2d_weight_grad.h"

#include <stddef.h>

#include "conv2d_geometry.h"
#include "q8_window.h"


int et_q8_conv2d_weight_grad_scratch_size(const et_conv2d_shape *s)
{
    return 6 * (s->c_in / s->groups * s->k_h * s->k_w); /* four output pixels' windows: int16 interleaved, then bytes */
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
 * holds pixels (p, p+1) and the next one (p+2, p+3): the pairs SMLAD multiplies with their gradients. The four
 * windows are copied as bytes first (et_q8_window_bytes), then four elements of each are widened per step:
 * SXTAB16 gives elements (j, j+2) of a pixel, its rotation (j+1, j+3), and PKHBT/PKHTB pair two pixels' halves. */
static void gather_quad(const et_conv2d_shape *s, const int8_t *xg, int32_t x_zp, long p, long plane_out,
                        int8_t *bytes, int16_t *col)
{
    const int len = s->c_in / s->groups * s->k_h * s->k_w;
    const uint32_t off = et_q8_dup16(-x_zp);
    const int8_t *b0 = bytes, *b1 = bytes + len, *b2 = bytes + 2 * len, *b3 = bytes + 3 * len;
    int k, j;

    for (k = 0; k < 4; ++k)
        if (p + k < plane_out)
            et_q8_window_bytes(s, xg, x_zp, (int)((p + k) / s->w_out) * s->stride_h - s->pad_h,
                               (int)((p + k) % s->w_out) * s->stride_w - s->pad_w, bytes + k * len);
        else
            for (j = 0; j < len; ++j)
                bytes[k * len + j] = (int8_t)x_zp; /* a pixel past the plane: 0, times a gradient of 0 */
    for (j = 0; j + 4 <= len; j += 4) {
        const uint32_t v0 = et_q8_load4(b0 + j), v1 = et_q8_load4(b1 + j), v2 = et_q8_load4(b2 + j), v3 = et_q8_load4(b3 + j);
        const uint32_t e0 = et_q8_sxtab16(off, v0), e1 = et_q8_sxtab16(off, v1), e2 = et_q8_sxtab16(off, v2),
                       e3 = et_q8_sxtab16(off, v3);
        const uint32_t o0 = et_q8_sxtab16_ror8(off, v0), o1 = et_q8_sxtab16_ror8(off, v1),
                       o2 = et_q8_sxtab16_ror8(off, v2), o3 = et_q8_sxtab16_ror8(off, v3);
        const uint32_t w[8] = {et_q8_pack_lo(e0, e1), et_q8_pack_lo(e2, e3), et_q8_pack_lo(o0, o1), et_q8_pack_lo(o2, o3),
                               et_q8_pack_hi(e0, e1), et_q8_pack_hi(e2, e3), et_q8_pack_hi(o0, o1), et_q8_pack_hi(o2, o3)};
        memcpy(col + 4 * j, w, sizeof w);
    }
    for (; j < len; ++j)
        for (k = 0; k < 4; ++k)
            col[4 * j + k] = (int16_t)(bytes[k * len + j] - x_zp);
}

/* r0[j] += (g0 of the four pixels) . col_j, r1[j] likewise with g1: two SMLADs per accumulator, the column's two
 * words loaded once for both rows (g0/g1 packed as (pixel 0, pixel 1), (pixel 2, pixel 3)). r1 NULL: one row. */
ET_Q8_NOINLINE static void outer_rows(const int16_t *col, int len, uint32_t a01, uint32_t a23, uint32_t b01, uint32_t b23, int32_t *r0,
                       int32_t *r1)
{
    int j;

    if (r1 != NULL)
        for (j = 0; j < len; ++j, col += 4) {
            const uint32_t c01 = et_q8_load2x16(col), c23 = et_q8_load2x16(col + 2);
            r0[j] = et_q8_smlad(c23, a23, et_q8_smlad(c01, a01, r0[j]));
            r1[j] = et_q8_smlad(c23, b23, et_q8_smlad(c01, b01, r1[j]));
        }
    else
        for (j = 0; j < len; ++j, col += 4)
            r0[j] = et_q8_smlad(et_q8_load2x16(col + 2), a23, et_q8_smlad(et_q8_load2x16(col), a01, r0[j]));
}

/* A pixel's gradient as a 16-bit half (0 past the plane). */
static uint32_t grad_at(const int8_t *gyc, long p, long plane_out)
{
    return p < plane_out ? (uint32_t)(int32_t)gyc[p] : 0u;
}

/* The weight gradient as a sum of outer products, four output pixels at a time: gw[oc][j] += the four pixels'
 * gradients of oc times their window element j (gather_quad), two SMLADs per accumulator, two output channels
 * sharing the window's loads, gw its own (int32) accumulator. */
static void by_outer_products(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                              int16_t *scratch, int32_t *gw)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, len = cin_g * s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    int8_t *bytes = (int8_t *)(scratch + 4 * len);
    int n, g, ocg, j;
    long p;

    for (j = 0; j < s->c_out * len; ++j)
        gw[j] = 0;
    for (n = 0; n < s->n; ++n)
        for (g = 0; g < s->groups; ++g) {
            const int8_t *xg = x + ((long)n * s->c_in + (long)g * cin_g) * s->h_in * s->w_in;
            const int8_t *gyg = gy + ((long)n * s->c_out + (long)g * cout_g) * plane_out;
            for (p = 0; p < plane_out; p += 4) {
                gather_quad(s, xg, x_zp, p, plane_out, bytes, scratch);
                for (ocg = 0; ocg < cout_g; ocg += 2) {
                    const int8_t *g0 = gyg + (long)ocg * plane_out, *g1 = g0 + plane_out;
                    int32_t *r0 = gw + ((long)g * cout_g + ocg) * len;
                    const uint32_t a01 = et_q8_pack_lo(grad_at(g0, p, plane_out), grad_at(g0, p + 1, plane_out));
                    const uint32_t a23 = et_q8_pack_lo(grad_at(g0, p + 2, plane_out), grad_at(g0, p + 3, plane_out));
                    if (ocg + 1 < cout_g)
                        outer_rows(scratch, len, a01, a23, et_q8_pack_lo(grad_at(g1, p, plane_out), grad_at(g1, p + 1, plane_out)),
                                   et_q8_pack_lo(grad_at(g1, p + 2, plane_out), grad_at(g1, p + 3, plane_out)), r0, r0 + len);
                    else
                        outer_rows(scratch, len, a01, a23, 0u, 0u, r0, NULL);
                }
            }
        }
}

/* Outer products where a group has 8 or more output channels to share each gathered window (fewer instructions per
 * MAC than the rows from there on: 3x3 16->16 2.99 against 3.53 on the M4F, pointwise 32->32 2.88 against 3.89);
 * rows where the stride along w is 1; outer products for a group of 4 or more; the plain loop otherwise (a
 * depthwise stride-2 layer: gathering would cost more than it saves). */
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int16_t *scratch, int32_t *gw, int32_t *gb)
{
    const int cout_g = s->c_out / s->groups;

    if (cout_g >= 8 || (s->stride_w != 1 && cout_g >= 4))
        by_outer_products(s, gy, x, x_zp, scratch, gw);
    else if (s->stride_w == 1)
        by_rows(s, gy, x, x_zp, gw);
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
