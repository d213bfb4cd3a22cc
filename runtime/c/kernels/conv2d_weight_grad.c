/*
 * conv2d_weight_grad.c - the convolution's weight and bias gradients, and the same fused with the SGD
 * step, direct loops (see conv2d_weight_grad.h).
 *
 * Speed: each tap's output rectangle inside the image is computed once (box_of, from conv2d_geometry.h);
 * the gradients run register-blocked 4 output channels x 2 input channels with no bounds check, `%` or
 * division in their loops, a group's last input channel 4 x 1. Channels left over from blocks of 4 (all of
 * a depthwise convolution's) take one pass over the plane per weight, which is already a long plain loop.
 * Blocking changes which gradients are computed together, never the order of one gradient's sum, so every
 * path gives the same bits.
 *
 * Rounding: each multiply-accumulate is an explicit fmaf (one rounding; see conv2d.c). torch's
 * weight-gradient GEMM (a vectorized dot product) sums in another order, so the two agree to float32
 * rounding.
 */
#include "conv2d_weight_grad.h"

#include <math.h>
#include <stddef.h>

#include "conv2d_geometry.h"

/* dL/dw[oc][icl][kh][kw] = sum over (n, oh, ow) of gy[n][oc][oh][ow] * x[n][ic][ih][iw], outputs limited to
 * those whose tap (kh, kw) lands inside the image. The tap's output rectangle [oh0, oh1) x [ow0, ow1). */
typedef struct tap_box {
    int oh0, oh1, ow0, ow1;
    int dh, dw; /* input offset of the tap: ih = oh*stride_h + dh */
} tap_box;

static tap_box box_of(const et_conv2d_shape *s, int kh, int kw)
{
    tap_box b;

    b.dh = kh * s->dil_h - s->pad_h;
    b.dw = kw * s->dil_w - s->pad_w;
    interior(b.dh, b.dh, s->stride_h, s->h_in, s->h_out, &b.oh0, &b.oh1);
    interior(b.dw, b.dw, s->stride_w, s->w_in, s->w_out, &b.ow0, &b.ow1);
    return b;
}

/* One weight's gradient. Shared by the separate and the fused kernels, which is what makes them identical. */
static float wgrad_point(const et_conv2d_shape *s, const float *gy, const float *x, int oc, int ic,
                         const tap_box *b)
{
    const long plane = (long)s->h_out * s->w_out, plane_in = (long)s->h_in * s->w_in;
    float acc = 0.0f;
    int n, oh, ow;

    for (n = 0; n < s->n; ++n) {
        const float *gyp = gy + ((long)n * s->c_out + oc) * plane;
        const float *xp = x + ((long)n * s->c_in + ic) * plane_in + b->dw;
        for (oh = b->oh0; oh < b->oh1; ++oh) {
            const float *gr = gyp + (long)oh * s->w_out;
            const float *xr = xp + (long)(oh * s->stride_h + b->dh) * s->w_in;
            for (ow = b->ow0; ow < b->ow1; ++ow)
                acc = fmaf(gr[ow], xr[ow * s->stride_w], acc);
        }
    }
    return acc;
}

/* The blocked gradients of one tap: output channels (oc .. oc+3) x input channels (ic, ic+1), one group.
 * g[j][k] receives the gradient of w[oc + j][ic + k - group's first][kh][kw]. */
static void wgrad_block_4x2(const et_conv2d_shape *s, const float *gy, const float *x, int oc, int ic,
                            const tap_box *b, float g[4][2])
{
    const long plane = (long)s->h_out * s->w_out, plane_in = (long)s->h_in * s->w_in;
    const int sw = s->stride_w;
    float a00 = 0.0f, a01 = 0.0f, a10 = 0.0f, a11 = 0.0f, a20 = 0.0f, a21 = 0.0f, a30 = 0.0f, a31 = 0.0f;
    int n, oh, ow;

    for (n = 0; n < s->n; ++n) {
        for (oh = b->oh0; oh < b->oh1; ++oh) {
            const float *g0 = gy + ((long)n * s->c_out + oc) * plane + (long)oh * s->w_out;
            const float *g1 = g0 + plane, *g2 = g1 + plane, *g3 = g2 + plane;
            const float *x0 = x + ((long)n * s->c_in + ic) * plane_in + (long)(oh * s->stride_h + b->dh) * s->w_in + b->dw;
            const float *x1 = x0 + plane_in;
            for (ow = b->ow0; ow < b->ow1; ++ow) {
                const float v0 = x0[ow * sw], v1 = x1[ow * sw];
                a00 = fmaf(g0[ow], v0, a00);
                a01 = fmaf(g0[ow], v1, a01);
                a10 = fmaf(g1[ow], v0, a10);
                a11 = fmaf(g1[ow], v1, a11);
                a20 = fmaf(g2[ow], v0, a20);
                a21 = fmaf(g2[ow], v1, a21);
                a30 = fmaf(g3[ow], v0, a30);
                a31 = fmaf(g3[ow], v1, a31);
            }
        }
    }
    g[0][0] = a00;
    g[0][1] = a01;
    g[1][0] = a10;
    g[1][1] = a11;
    g[2][0] = a20;
    g[2][1] = a21;
    g[3][0] = a30;
    g[3][1] = a31;
}

/* The blocked gradients of one tap for output channels (oc .. oc+3) and one input channel: g[j][0]. */
static void wgrad_block_4x1(const et_conv2d_shape *s, const float *gy, const float *x, int oc, int ic,
                            const tap_box *b, float g[4][2])
{
    const long plane = (long)s->h_out * s->w_out, plane_in = (long)s->h_in * s->w_in;
    const int sw = s->stride_w;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int n, oh, ow;

    for (n = 0; n < s->n; ++n) {
        for (oh = b->oh0; oh < b->oh1; ++oh) {
            const float *g0 = gy + ((long)n * s->c_out + oc) * plane + (long)oh * s->w_out;
            const float *g1 = g0 + plane, *g2 = g1 + plane, *g3 = g2 + plane;
            const float *x0 = x + ((long)n * s->c_in + ic) * plane_in + (long)(oh * s->stride_h + b->dh) * s->w_in + b->dw;
            for (ow = b->ow0; ow < b->ow1; ++ow) {
                const float v = x0[ow * sw];
                a0 = fmaf(g0[ow], v, a0);
                a1 = fmaf(g1[ow], v, a1);
                a2 = fmaf(g2[ow], v, a2);
                a3 = fmaf(g3[ow], v, a3);
            }
        }
    }
    g[0][0] = a0;
    g[1][0] = a1;
    g[2][0] = a2;
    g[3][0] = a3;
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

/* Every weight gradient, in blocks where the channels allow, each handed to `put` (store or SGD step). */
typedef void (*wgrad_sink)(long i, float g, const et_sgd_params *opt, float *w, float *w_buf);

static void store_grad(long i, float g, const et_sgd_params *opt, float *gw, float *unused)
{
    (void)opt;
    (void)unused;
    gw[i] = g;
}

static void sgd_grad(long i, float g, const et_sgd_params *opt, float *w, float *w_buf)
{
    et_sgd_update(opt, &w[i], g, w_buf != NULL ? &w_buf[i] : NULL);
}

static void wgrad_all(const et_conv2d_shape *s, const float *gy, const float *x, wgrad_sink put,
                      const et_sgd_params *opt, float *w, float *w_buf)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, khw = s->k_h * s->k_w;
    float g[4][2];
    int oc, icl, kh, kw, j, k, nb_oc, nb_ic;

    for (oc = 0; oc < s->c_out; oc += nb_oc) {
        const int ic0 = (oc / cout_g) * cin_g;
        nb_oc = cout_g - oc % cout_g >= 4 ? 4 : 1;
        for (icl = 0; icl < cin_g; icl += nb_ic) {
            nb_ic = nb_oc == 4 && cin_g - icl >= 2 ? 2 : 1;
            for (kh = 0; kh < s->k_h; ++kh) {
                for (kw = 0; kw < s->k_w; ++kw) {
                    const tap_box b = box_of(s, kh, kw);
                    const long i = ((long)oc * cin_g + icl) * khw + kh * s->k_w + kw;
                    if (nb_ic == 2) {
                        wgrad_block_4x2(s, gy, x, oc, ic0 + icl, &b, g);
                    } else if (nb_oc == 4) { /* a group's last input channel (or its only one) */
                        wgrad_block_4x1(s, gy, x, oc, ic0 + icl, &b, g);
                    } else {
                        for (j = 0; j < nb_oc; ++j)
                            g[j][0] = wgrad_point(s, gy, x, oc + j, ic0 + icl, &b);
                    }
                    for (j = 0; j < nb_oc; ++j)
                        for (k = 0; k < nb_ic; ++k)
                            put(i + (long)j * cin_g * khw + (long)k * khw, g[j][k], opt, w, w_buf);
                }
            }
        }
    }
}

void et_conv2d_backward_weight(const et_conv2d_shape *s, const float *gy, const float *x, float *gw,
                               float *gb)
{
    int oc;

    wgrad_all(s, gy, x, store_grad, NULL, gw, NULL);
    if (gb != NULL)
        for (oc = 0; oc < s->c_out; ++oc)
            gb[oc] = conv2d_bias_grad(s, gy, oc);
}

void et_conv2d_wgrad_sgd(const et_conv2d_shape *s, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf)
{
    int oc;

    if (w != NULL)
        wgrad_all(s, gy, x, sgd_grad, opt, w, w_buf);
    if (b != NULL)
        for (oc = 0; oc < s->c_out; ++oc)
            et_sgd_update(opt, &b[oc], conv2d_bias_grad(s, gy, oc), b_buf != NULL ? &b_buf[oc] : NULL);
}
