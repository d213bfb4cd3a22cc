/* q8_conv2d_weight_grad.c - see q8_conv2d_weight_grad.h. */
#include "q8_conv2d_weight_grad.h"

#include <stddef.h>

#include "conv2d_geometry.h"

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
/* For each kernel tap, the outputs whose tap lands inside the image form one contiguous run per output
 * row (stride 1 along w), and so do the inputs they read: each run is a dot product of x's row (offset by
 * -x_zp) with gy's rows, four output channels of a group sharing x's unpacking (et_q8_dot4_rows). */
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int32_t *gw, int32_t *gb)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, taps = s->k_h * s->k_w;
    const long plane_out = (long)s->h_out * s->w_out;
    int g, ocg, icg, kh, kw, n, oh;

    if (s->stride_w != 1) {
        et_q8_conv2d_backward_weight_ref(s, gy, x, x_zp, gw, gb);
        return;
    }
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
    if (gb != NULL)
        bias_grad(s, gy, gb);
}
#else
void et_q8_conv2d_backward_weight(const et_conv2d_shape *s, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int32_t *gw, int32_t *gb)
{
    et_q8_conv2d_backward_weight_ref(s, gy, x, x_zp, gw, gb);
}
#endif
