/*
 * conv2d.c - the convolution's forward, direct loops (see conv2d.h); its gradients are in
 * conv2d_input_grad.c and conv2d_weight_grad.c.
 *
 * Every output element is one accumulator, summed in a fixed order and written once; there is no im2col
 * (it would need a scratch buffer as large as the unfolded input), so the result is the same on every
 * target and easy to audit. Padding taps are skipped, not multiplied by zero.
 *
 * Speed: the border is split from the interior (conv2d_geometry.h). The interior runs register-blocked
 * 4 output channels x 2 output pixels (8 accumulators; each tap loads 2 inputs and 4 weights for 8
 * multiply-adds) with no bounds check, `%` or division in its loops; 3-wide stride-1 rows (3x3
 * convolutions) are unrolled, the two pixels sharing 4 input loads, and a pointwise (1x1) forward runs one
 * loop over input channels instead of three nested ones. Border pixels and an odd pixel run 4 x 1 blocks
 * over the same precomputed (clipped) ranges. Channels left over from blocks of 4 (all of a depthwise
 * convolution's) run 1 channel x 4 pixels in the interior and one element at a time elsewhere.
 * Blocking changes which outputs are computed together, never the order of one output's sum, so every
 * path gives the same bits.
 *
 * Rounding: each multiply-accumulate is an explicit fmaf (one rounding), as in torch's CPU kernels
 * (BLAS and oneDNN use FMA instructions); fmaf is correctly rounded by definition, so host and Cortex-M4F (VFMA)
 * agree bit for bit. The sum follows torch's im2col + GEMM path (slow_conv2d, which torch takes for
 * batch-1 convolutions with kernels up to 3x3, the usual case on a MCU): over (input channel, kernel row,
 * kernel column) as the GEMM's K, which then matches torch bit for bit (measured on an AVX-512 host).
 * oneDNN's blocked kernels (larger kernels, batches) sum in other orders, so those agree to float32 rounding.
 */
#include "conv2d.h"

#include <math.h>
#include <stddef.h>

#include "../et_status.h"
#include "conv2d_geometry.h"

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

/* -- forward ------------------------------------------------------------------------------------------ */

/* One output y[n][oc][oh][ow]: sum over (input channel, kernel row, kernel column), taps clipped to the
 * image by precomputed ranges, bias last (torch adds it to the finished dot product). */
static float fwd_point(const et_conv2d_shape *s, const float *x, const float *w, const float *b, int n, int oc,
                       int oh, int ow)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int ih0 = oh * s->stride_h - s->pad_h, iw0 = ow * s->stride_w - s->pad_w;
    const int ic0 = (oc / cout_g) * cin_g;
    int kh0, kh1, kw0, kw1, icl, kh, kw;
    float acc = 0.0f;

    tap_range(ih0, s->dil_h, s->k_h, s->h_in, &kh0, &kh1);
    tap_range(iw0, s->dil_w, s->k_w, s->w_in, &kw0, &kw1);
    for (icl = 0; icl < cin_g; ++icl) {
        const float *xp = x + ((long)n * s->c_in + ic0 + icl) * s->h_in * s->w_in + iw0;
        const float *wp = w + ((long)oc * cin_g + icl) * s->k_h * s->k_w;
        for (kh = kh0; kh < kh1; ++kh) {
            const float *xr = xp + (long)(ih0 + kh * s->dil_h) * s->w_in;
            const float *wr = wp + kh * s->k_w;
            for (kw = kw0; kw < kw1; ++kw)
                acc = fmaf(xr[kw * s->dil_w], wr[kw], acc);
        }
    }
    return b != NULL ? acc + b[oc] : acc;
}

/* One kernel row of 3 taps for two neighbouring pixels (stride 1, dilation 1) from inputs x0..x3. */
static inline void taps3_x2(float x0, float x1, float x2, float x3, const float *wr, float *a, float *b)
{
    *a = fmaf(x2, wr[2], fmaf(x1, wr[1], fmaf(x0, wr[0], *a)));
    *b = fmaf(x3, wr[2], fmaf(x2, wr[1], fmaf(x1, wr[0], *b)));
}

/* The interior block: outputs (oc .. oc+3) x (ow, ow+1) of row oh, every kernel column inside the image,
 * kernel rows [kh0, kh1). y points at y[n][oc][oh][ow]. */
static void fwd_block_4x2(const et_conv2d_shape *s, const float *x, const float *w, const float *b, int n, int oc,
                          int oh, int ow, int kh0, int kh1, float *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int ic0 = (oc / cout_g) * cin_g, sw = s->stride_w, dw = s->dil_w, kw_n = s->k_w;
    const long wst = (long)cin_g * s->k_h * s->k_w; /* from one output channel's weights to the next */
    const long plane = (long)s->h_out * s->w_out;
    const int row3 = kw_n == 3 && dw == 1 && sw == 1; /* the common 3x3 convolution, unrolled */
    float a00 = 0.0f, a01 = 0.0f, a10 = 0.0f, a11 = 0.0f, a20 = 0.0f, a21 = 0.0f, a30 = 0.0f, a31 = 0.0f;
    int icl, kh, kw;

    if (s->k_h == 1 && kw_n == 1 && kh0 < kh1) { /* pointwise (1x1): a sum over input channels alone */
        const long plane_in = (long)s->h_in * s->w_in;
        const float *xp = x + ((long)n * s->c_in + ic0) * plane_in + (long)(oh * s->stride_h - s->pad_h) * s->w_in +
                          (ow * sw - s->pad_w);
        const float *w0 = w + (long)oc * cin_g, *w1 = w0 + wst, *w2 = w1 + wst, *w3 = w2 + wst;
        for (icl = 0; icl < cin_g; ++icl, xp += plane_in) {
            const float x0 = xp[0], x1 = xp[sw];
            a00 = fmaf(x0, w0[icl], a00);
            a01 = fmaf(x1, w0[icl], a01);
            a10 = fmaf(x0, w1[icl], a10);
            a11 = fmaf(x1, w1[icl], a11);
            a20 = fmaf(x0, w2[icl], a20);
            a21 = fmaf(x1, w2[icl], a21);
            a30 = fmaf(x0, w3[icl], a30);
            a31 = fmaf(x1, w3[icl], a31);
        }
    } else {
        for (icl = 0; icl < cin_g; ++icl) {
            const float *xp = x + ((long)n * s->c_in + ic0 + icl) * s->h_in * s->w_in + (ow * sw - s->pad_w);
            const float *wp = w + ((long)oc * cin_g + icl) * s->k_h * s->k_w;
            for (kh = kh0; kh < kh1; ++kh) {
                const float *xr = xp + (long)(oh * s->stride_h - s->pad_h + kh * s->dil_h) * s->w_in;
                const float *w0 = wp + kh * kw_n, *w1 = w0 + wst, *w2 = w1 + wst, *w3 = w2 + wst;
                if (row3) { /* 3 taps, stride 1: the two pixels read 4 inputs, each sum in tap order */
                    const float x0 = xr[0], x1 = xr[1], x2 = xr[2], x3 = xr[3];
                    taps3_x2(x0, x1, x2, x3, w0, &a00, &a01);
                    taps3_x2(x0, x1, x2, x3, w1, &a10, &a11);
                    taps3_x2(x0, x1, x2, x3, w2, &a20, &a21);
                    taps3_x2(x0, x1, x2, x3, w3, &a30, &a31);
                    continue;
                }
                for (kw = 0; kw < kw_n; ++kw) {
                    const float x0 = xr[kw * dw], x1 = xr[kw * dw + sw];
                    a00 = fmaf(x0, w0[kw], a00);
                    a01 = fmaf(x1, w0[kw], a01);
                    a10 = fmaf(x0, w1[kw], a10);
                    a11 = fmaf(x1, w1[kw], a11);
                    a20 = fmaf(x0, w2[kw], a20);
                    a21 = fmaf(x1, w2[kw], a21);
                    a30 = fmaf(x0, w3[kw], a30);
                    a31 = fmaf(x1, w3[kw], a31);
                }
            }
        }
    }
    if (b != NULL) {
        a00 += b[oc];
        a01 += b[oc];
        a10 += b[oc + 1];
        a11 += b[oc + 1];
        a20 += b[oc + 2];
        a21 += b[oc + 2];
        a30 += b[oc + 3];
        a31 += b[oc + 3];
    }
    y[0] = a00;
    y[1] = a01;
    y[plane] = a10;
    y[plane + 1] = a11;
    y[2 * plane] = a20;
    y[2 * plane + 1] = a21;
    y[3 * plane] = a30;
    y[3 * plane + 1] = a31;
}

/* One pixel of 4 output channels (oc .. oc+3, one group) at any column, its kernel columns clipped to the
 * image as fwd_point clips them (the borders and an odd interior pixel). y points at y[n][oc][oh][ow]. */
static void fwd_block_4x1(const et_conv2d_shape *s, const float *x, const float *w, const float *b, int n, int oc,
                          int oh, int ow, int kh0, int kh1, float *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int ic0 = (oc / cout_g) * cin_g, iw0 = ow * s->stride_w - s->pad_w, dw = s->dil_w;
    const long wst = (long)cin_g * s->k_h * s->k_w; /* from one output channel's weights to the next */
    const long plane = (long)s->h_out * s->w_out;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int icl, kh, kw, kw0, kw1;

    tap_range(iw0, dw, s->k_w, s->w_in, &kw0, &kw1);
    for (icl = 0; icl < cin_g; ++icl) {
        const float *xp = x + ((long)n * s->c_in + ic0 + icl) * s->h_in * s->w_in + iw0;
        const float *wp = w + ((long)oc * cin_g + icl) * s->k_h * s->k_w;
        for (kh = kh0; kh < kh1; ++kh) {
            const float *xr = xp + (long)(oh * s->stride_h - s->pad_h + kh * s->dil_h) * s->w_in;
            const float *w0 = wp + kh * s->k_w, *w1 = w0 + wst, *w2 = w1 + wst, *w3 = w2 + wst;
            for (kw = kw0; kw < kw1; ++kw) {
                const float v = xr[kw * dw];
                a0 = fmaf(v, w0[kw], a0);
                a1 = fmaf(v, w1[kw], a1);
                a2 = fmaf(v, w2[kw], a2);
                a3 = fmaf(v, w3[kw], a3);
            }
        }
    }
    if (b != NULL) {
        a0 += b[oc];
        a1 += b[oc + 1];
        a2 += b[oc + 2];
        a3 += b[oc + 3];
    }
    y[0] = a0;
    y[plane] = a1;
    y[2 * plane] = a2;
    y[3 * plane] = a3;
}

/* The interior block of one output channel: pixels ow .. ow+3 of row oh, every kernel column inside the
 * image (single channels: depthwise convolutions, a group's leftover channels). y points at y[n][oc][oh][ow]. */
static void fwd_block_1x4(const et_conv2d_shape *s, const float *x, const float *w, const float *b, int n, int oc,
                          int oh, int ow, int kh0, int kh1, float *y)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int ic0 = (oc / cout_g) * cin_g, sw = s->stride_w, dw = s->dil_w, kw_n = s->k_w;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int icl, kh, kw;

    for (icl = 0; icl < cin_g; ++icl) {
        const float *xp = x + ((long)n * s->c_in + ic0 + icl) * s->h_in * s->w_in + (ow * sw - s->pad_w);
        const float *wp = w + ((long)oc * cin_g + icl) * s->k_h * s->k_w;
        for (kh = kh0; kh < kh1; ++kh) {
            const float *xr = xp + (long)(oh * s->stride_h - s->pad_h + kh * s->dil_h) * s->w_in;
            const float *wr = wp + kh * kw_n;
            for (kw = 0; kw < kw_n; ++kw) {
                const float *xk = xr + kw * dw;
                const float v = wr[kw];
                a0 = fmaf(xk[0], v, a0);
                a1 = fmaf(xk[sw], v, a1);
                a2 = fmaf(xk[2 * sw], v, a2);
                a3 = fmaf(xk[3 * sw], v, a3);
            }
        }
    }
    if (b != NULL) {
        a0 += b[oc];
        a1 += b[oc];
        a2 += b[oc];
        a3 += b[oc];
    }
    y[0] = a0;
    y[1] = a1;
    y[2] = a2;
    y[3] = a3;
}

void et_conv2d_forward(const et_conv2d_shape *s, const float *x, const float *w, const float *b, float *y)
{
    const int cout_g = s->c_out / s->groups;
    const long plane = (long)s->h_out * s->w_out;
    int n, oc, oh, ow, nb, ow_lo, ow_hi, kh0, kh1;

    interior(-s->pad_w, (s->k_w - 1) * s->dil_w - s->pad_w, s->stride_w, s->w_in, s->w_out, &ow_lo, &ow_hi);
    for (n = 0; n < s->n; ++n) {
        for (oc = 0; oc < s->c_out; oc += nb) {
            nb = cout_g - oc % cout_g >= 4 ? 4 : 1; /* blocks of 4 channels of one group, then one by one */
            for (oh = 0; oh < s->h_out; ++oh) {
                float *yr = y + ((long)n * s->c_out + oc) * plane + (long)oh * s->w_out;
                ow = 0;
                if (nb == 4) {
                    tap_range(oh * s->stride_h - s->pad_h, s->dil_h, s->k_h, s->h_in, &kh0, &kh1);
                    for (; ow < ow_lo; ++ow) /* left border: the columns clipped */
                        fwd_block_4x1(s, x, w, b, n, oc, oh, ow, kh0, kh1, yr + ow);
                    for (; ow + 1 < ow_hi; ow += 2) /* interior, two pixels at a time */
                        fwd_block_4x2(s, x, w, b, n, oc, oh, ow, kh0, kh1, yr + ow);
                    for (; ow < s->w_out; ++ow) /* an odd interior pixel, the right border */
                        fwd_block_4x1(s, x, w, b, n, oc, oh, ow, kh0, kh1, yr + ow);
                }
                if (nb == 1) { /* a single channel (a group's leftover, depthwise): 4 interior pixels at once */
                    tap_range(oh * s->stride_h - s->pad_h, s->dil_h, s->k_h, s->h_in, &kh0, &kh1);
                    for (; ow < ow_lo; ++ow) /* left border */
                        yr[ow] = fwd_point(s, x, w, b, n, oc, oh, ow);
                    for (; ow + 3 < ow_hi; ow += 4)
                        fwd_block_1x4(s, x, w, b, n, oc, oh, ow, kh0, kh1, yr + ow);
                    for (; ow < s->w_out; ++ow) /* leftover interior pixels, the right border */
                        yr[ow] = fwd_point(s, x, w, b, n, oc, oh, ow);
                }
            }
        }
    }
}
