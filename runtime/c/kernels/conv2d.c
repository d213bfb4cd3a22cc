/*
 * conv2d.c - direct convolution loops (see conv2d.h).
 *
 * Every output element is one accumulator, summed in a fixed order and written once; there is no im2col
 * (it would need a scratch buffer as large as the unfolded input) and no blocking, so the result is the
 * same on every target and easy to audit. Padding taps are skipped rather than multiplied by zero.
 *
 * Rounding: each multiply-accumulate is an explicit fmaf (one rounding), as in torch's CPU kernels
 * (BLAS and oneDNN use FMA instructions); fmaf is correctly rounded by definition, so host and Cortex-M4F (VFMA)
 * agree bit for bit. The sums follow torch's im2col + GEMM path (slow_conv2d, which torch takes for
 * batch-1 convolutions with kernels up to 3x3, the usual case on a MCU): the forward sums over (input
 * channel, kernel row, kernel column) as the GEMM's K, the input gradient adds per-tap channel sums in
 * tap order as col2im does - both then match torch bit for bit (measured on an AVX-512 host). oneDNN's
 * blocked kernels (larger kernels, batches) and the weight-gradient GEMM (a vectorized dot product) sum
 * in other orders, so those agree to float32 rounding.
 */
#include "conv2d.h"

#include <math.h>
#include <stddef.h>

#include "../et_status.h"

int et_conv2d_shape_check(const et_conv2d_shape *s)
{
    int span_h, span_w;

    if (s == NULL || s->n <= 0 || s->c_in <= 0 || s->h_in <= 0 || s->w_in <= 0 || s->c_out <= 0 ||
        s->k_h <= 0 || s->k_w <= 0 || s->stride_h <= 0 || s->stride_w <= 0 || s->pad_h < 0 ||
        s->pad_w < 0 || s->dil_h <= 0 || s->dil_w <= 0 || s->groups <= 0)
        return ET_ERR_ARG;
    if (s->c_in % s->groups != 0 || s->c_out % s->groups != 0)
        return ET_ERR_ARG;
    span_h = s->h_in + 2 * s->pad_h - s->dil_h * (s->k_h - 1) - 1; /* < 0: the kernel does not fit */
    span_w = s->w_in + 2 * s->pad_w - s->dil_w * (s->k_w - 1) - 1;
    if (span_h < 0 || span_w < 0 || s->h_out != span_h / s->stride_h + 1 || s->w_out != span_w / s->stride_w + 1)
        return ET_ERR_ARG;
    return ET_OK;
}

void et_conv2d_forward(const et_conv2d_shape *s, const float *x, const float *w, const float *b, float *y)
{
    const int cin_g = s->c_in / s->groups;   /* input channels per group */
    const int cout_g = s->c_out / s->groups; /* output channels per group */
    int n, oc, oh, ow, icl, kh, kw;

    for (n = 0; n < s->n; ++n) {
        for (oc = 0; oc < s->c_out; ++oc) {
            const int ic0 = (oc / cout_g) * cin_g; /* first input channel of this group */
            float *yp = y + ((long)n * s->c_out + oc) * s->h_out * s->w_out;
            for (oh = 0; oh < s->h_out; ++oh) {
                for (ow = 0; ow < s->w_out; ++ow) {
                    /* Sum over (input channel, kernel row, kernel column) in that order, then add the bias
                     * last, as torch adds it to the finished dot product. */
                    float acc = 0.0f;
                    for (icl = 0; icl < cin_g; ++icl) {
                        const float *xp = x + ((long)n * s->c_in + ic0 + icl) * s->h_in * s->w_in;
                        const float *wp = w + ((long)oc * cin_g + icl) * s->k_h * s->k_w;
                        for (kh = 0; kh < s->k_h; ++kh) {
                            const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
                            if (ih < 0 || ih >= s->h_in)
                                continue; /* a padding row: contributes 0 */
                            for (kw = 0; kw < s->k_w; ++kw) {
                                const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
                                if (iw < 0 || iw >= s->w_in)
                                    continue;
                                acc = fmaf(xp[ih * s->w_in + iw], wp[kh * s->k_w + kw], acc);
                            }
                        }
                    }
                    if (b != NULL)
                        acc += b[oc];
                    yp[oh * s->w_out + ow] = acc;
                }
            }
        }
    }
}

void et_conv2d_backward_input(const et_conv2d_shape *s, const float *gy, const float *w, float *gx)
{
    const int cin_g = s->c_in / s->groups;
    const int cout_g = s->c_out / s->groups;
    int n, ic, ih, iw, ocl, kh, kw;

    /* Gather form: each input element collects the outputs it fed, so every gx element is written once
     * and needs no zeroing. Per kernel tap (kh, kw) - the output (oh, ow) with
     * ih = oh*stride - pad + kh*dil, if there is one - the tap's sum over output channels is formed
     * first and then added to the element: torch's path for small convolutions computes exactly these
     * tap sums (columns = W^T gy) and adds them in tap order (col2im). */
    for (n = 0; n < s->n; ++n) {
        for (ic = 0; ic < s->c_in; ++ic) {
            const int g = ic / cin_g;
            const int icl = ic - g * cin_g; /* index of this channel inside its group's weights */
            float *gxp = gx + ((long)n * s->c_in + ic) * s->h_in * s->w_in;
            for (ih = 0; ih < s->h_in; ++ih) {
                for (iw = 0; iw < s->w_in; ++iw) {
                    float acc = 0.0f;
                    for (kh = 0; kh < s->k_h; ++kh) {
                        /* Which output row used input row ih through kernel row kh, if any. */
                        const int th = ih + s->pad_h - kh * s->dil_h;
                        int oh;
                        if (th < 0 || th % s->stride_h != 0)
                            continue;
                        oh = th / s->stride_h;
                        if (oh >= s->h_out)
                            continue;
                        for (kw = 0; kw < s->k_w; ++kw) {
                            const int tw = iw + s->pad_w - kw * s->dil_w;
                            int ow;
                            float tap = 0.0f;
                            if (tw < 0 || tw % s->stride_w != 0)
                                continue;
                            ow = tw / s->stride_w;
                            if (ow >= s->w_out)
                                continue;
                            for (ocl = 0; ocl < cout_g; ++ocl) {
                                const int oc = g * cout_g + ocl;
                                tap = fmaf(gy[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow],
                                           w[(((long)oc * cin_g + icl) * s->k_h + kh) * s->k_w + kw], tap);
                            }
                            acc += tap;
                        }
                    }
                    gxp[ih * s->w_in + iw] = acc;
                }
            }
        }
    }
}

/* dL/dw[oc][icl][kh][kw] = sum over (n, oh, ow) of gy[n][oc][oh][ow] * x[n][ic][ih][iw]. Shared by the
 * separate and the fused kernels, which is what makes their results identical. */
static float conv2d_weight_grad(const et_conv2d_shape *s, const float *gy, const float *x, int oc, int icl,
                                int kh, int kw)
{
    const int cin_g = s->c_in / s->groups;
    const int cout_g = s->c_out / s->groups;
    const int ic = (oc / cout_g) * cin_g + icl;
    float acc = 0.0f;
    int n, oh, ow;

    for (n = 0; n < s->n; ++n) {
        const float *gyp = gy + ((long)n * s->c_out + oc) * s->h_out * s->w_out;
        const float *xp = x + ((long)n * s->c_in + ic) * s->h_in * s->w_in;
        for (oh = 0; oh < s->h_out; ++oh) {
            const int ih = oh * s->stride_h - s->pad_h + kh * s->dil_h;
            if (ih < 0 || ih >= s->h_in)
                continue;
            for (ow = 0; ow < s->w_out; ++ow) {
                const int iw = ow * s->stride_w - s->pad_w + kw * s->dil_w;
                if (iw < 0 || iw >= s->w_in)
                    continue;
                acc = fmaf(gyp[oh * s->w_out + ow], xp[ih * s->w_in + iw], acc);
            }
        }
    }
    return acc;
}

/* dL/db[oc] = sum over (n, oh, ow) of gy[n][oc][oh][ow]. */
static float conv2d_bias_grad(const et_conv2d_shape *s, const float *gy, int oc)
{
    const int hw = s->h_out * s->w_out;
    float acc = 0.0f;
    int n, i;

    for (n = 0; n < s->n; ++n) {
        const float *gyp = gy + ((long)n * s->c_out + oc) * hw;
        for (i = 0; i < hw; ++i)
            acc += gyp[i];
    }
    return acc;
}

void et_conv2d_backward_weight(const et_conv2d_shape *s, const float *gy, const float *x, float *gw,
                               float *gb)
{
    const int cin_g = s->c_in / s->groups;
    int oc, icl, kh, kw;

    for (oc = 0; oc < s->c_out; ++oc)
        for (icl = 0; icl < cin_g; ++icl)
            for (kh = 0; kh < s->k_h; ++kh)
                for (kw = 0; kw < s->k_w; ++kw)
                    gw[(((long)oc * cin_g + icl) * s->k_h + kh) * s->k_w + kw] =
                        conv2d_weight_grad(s, gy, x, oc, icl, kh, kw);
    if (gb != NULL)
        for (oc = 0; oc < s->c_out; ++oc)
            gb[oc] = conv2d_bias_grad(s, gy, oc);
}

void et_conv2d_wgrad_sgd(const et_conv2d_shape *s, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf)
{
    const int cin_g = s->c_in / s->groups;
    int oc, icl, kh, kw;

    for (oc = 0; oc < s->c_out; ++oc)
        for (icl = 0; icl < cin_g; ++icl)
            for (kh = 0; kh < s->k_h; ++kh)
                for (kw = 0; kw < s->k_w; ++kw) {
                    const long i = (((long)oc * cin_g + icl) * s->k_h + kh) * s->k_w + kw;
                    et_sgd_update(opt, &w[i], conv2d_weight_grad(s, gy, x, oc, icl, kh, kw),
                                  w_buf != NULL ? &w_buf[i] : NULL);
                }
    if (b != NULL)
        for (oc = 0; oc < s->c_out; ++oc)
            et_sgd_update(opt, &b[oc], conv2d_bias_grad(s, gy, oc), b_buf != NULL ? &b_buf[oc] : NULL);
}
