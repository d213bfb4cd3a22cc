/*
 * conv2d_input_grad.c - the convolution's input gradient, direct loops (see conv2d_input_grad.h).
 *
 * Speed: for each input row the kernel rows that reach an output are found once (taps_of); pixels of one
 * phase whose column taps agree (the interior) run register-blocked 4 input channels x 2 input pixels with
 * no bounds check, `%` or division in their loops. Border pixels and a pixel without a partner run 4 x 1
 * blocks over their own precomputed taps. Channels left over from blocks of 4 (all of a depthwise
 * convolution's) run 1 channel x 4 pixels in the interior and one element at a time elsewhere.
 * Blocking changes which outputs are computed together, never the order of one output's sum, so every
 * path gives the same bits.
 *
 * Rounding: each multiply-accumulate is an explicit fmaf (one rounding; see conv2d.c). The per-tap channel
 * sums are added in tap order as torch's col2im does, which then matches torch bit for bit for the
 * convolutions it runs through im2col + GEMM (measured on an AVX-512 host); oneDNN's blocked kernels sum
 * in other orders, so those agree to float32 rounding.
 */
#include "conv2d_input_grad.h"

#include <math.h>

/* Gather form: each input element collects the outputs it fed, so every gx element is written once and
 * needs no zeroing. Per kernel tap (kh, kw) - the output (oh, ow) with ih = oh*stride - pad + kh*dil, if
 * there is one - the tap's sum over output channels is formed first and then added to the element: torch's
 * path for small convolutions computes exactly these tap sums (columns = W^T gy) and adds them in tap
 * order (col2im). */

/* The taps of one input index i along an axis: k = first, first + step, ..., last (first > last: none),
 * feeding output (i + pad - k*dil) / stride, which is o_first for k = first and falls by o_step per tap. */
typedef struct tap_set {
    int first, last, step, o_first, o_step;
} tap_set;

static tap_set taps_of(int i, int pad, int dil, int stride, int k, int out)
{
    tap_set t = {0, -1, 1, 0, 0};
    int kk, g = 0;

    for (kk = 0; kk < k; ++kk) { /* once per row or column, never per multiply-add */
        const int th = i + pad - kk * dil;
        if (th < 0 || th % stride != 0 || th / stride >= out)
            continue;
        if (g == 0)
            t.first = kk, t.o_first = th / stride;
        else if (g == 1)
            t.step = kk - t.first, t.o_step = (t.step * dil) / stride;
        t.last = kk;
        ++g;
    }
    return t;
}

/* One input-gradient element gx[n][ic][ih][iw], taps from the precomputed row set and the column's own. */
static float bwd_in_point(const et_conv2d_shape *s, const float *gy, const float *w, int n, int ic,
                          const tap_set *rows, int iw)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int g = ic / cin_g, icl = ic - g * cin_g;
    const long plane = (long)s->h_out * s->w_out;
    const tap_set cols = taps_of(iw, s->pad_w, s->dil_w, s->stride_w, s->k_w, s->w_out);
    int kh, kw, oh, ow, ocl;
    float acc = 0.0f;

    for (kh = rows->first, oh = rows->o_first; kh <= rows->last; kh += rows->step, oh -= rows->o_step) {
        for (kw = cols.first, ow = cols.o_first; kw <= cols.last; kw += cols.step, ow -= cols.o_step) {
            const float *gp = gy + ((long)n * s->c_out + (long)g * cout_g) * plane + (long)oh * s->w_out + ow;
            const float *wp = w + (((long)g * cout_g * cin_g + icl) * s->k_h + kh) * s->k_w + kw;
            const long wst = (long)cin_g * s->k_h * s->k_w;
            float tap = 0.0f;
            for (ocl = 0; ocl < cout_g; ++ocl)
                tap = fmaf(gp[ocl * plane], wp[ocl * wst], tap);
            acc += tap;
        }
    }
    return acc;
}

/* The interior block: input channels (ic .. ic+3, one group) x input pixels (iw, iw + stride_w), which share
 * their column taps `cols` (the second pixel's outputs are one to the right). gx points at gx[n][ic][ih][iw]. */
static void bwd_in_block_4x2(const et_conv2d_shape *s, const float *gy, const float *w, int n, int ic,
                             const tap_set *rows, const tap_set *cols, float *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int g = ic / cin_g, icl = ic - g * cin_g, khw = s->k_h * s->k_w;
    const long plane = (long)s->h_out * s->w_out, plane_in = (long)s->h_in * s->w_in;
    const long wst = (long)cin_g * khw; /* from one output channel's weights to the next */
    float a00 = 0.0f, a01 = 0.0f, a10 = 0.0f, a11 = 0.0f, a20 = 0.0f, a21 = 0.0f, a30 = 0.0f, a31 = 0.0f;
    int kh, kw, oh, ow, ocl;

    for (kh = rows->first, oh = rows->o_first; kh <= rows->last; kh += rows->step, oh -= rows->o_step) {
        for (kw = cols->first, ow = cols->o_first; kw <= cols->last; kw += cols->step, ow -= cols->o_step) {
            const float *gp = gy + ((long)n * s->c_out + (long)g * cout_g) * plane + (long)oh * s->w_out + ow;
            const float *wp = w + (((long)g * cout_g * cin_g + icl) * s->k_h + kh) * s->k_w + kw;
            float t00 = 0.0f, t01 = 0.0f, t10 = 0.0f, t11 = 0.0f, t20 = 0.0f, t21 = 0.0f, t30 = 0.0f, t31 = 0.0f;
            for (ocl = 0; ocl < cout_g; ++ocl, gp += plane, wp += wst) {
                const float g0 = gp[0], g1 = gp[1];
                const float w0 = wp[0], w1 = wp[khw], w2 = wp[2 * khw], w3 = wp[3 * khw];
                t00 = fmaf(g0, w0, t00);
                t01 = fmaf(g1, w0, t01);
                t10 = fmaf(g0, w1, t10);
                t11 = fmaf(g1, w1, t11);
                t20 = fmaf(g0, w2, t20);
                t21 = fmaf(g1, w2, t21);
                t30 = fmaf(g0, w3, t30);
                t31 = fmaf(g1, w3, t31);
            }
            a00 += t00;
            a01 += t01;
            a10 += t10;
            a11 += t11;
            a20 += t20;
            a21 += t21;
            a30 += t30;
            a31 += t31;
        }
    }
    gx[0] = a00;
    gx[s->stride_w] = a01;
    gx[plane_in] = a10;
    gx[plane_in + s->stride_w] = a11;
    gx[2 * plane_in] = a20;
    gx[2 * plane_in + s->stride_w] = a21;
    gx[3 * plane_in] = a30;
    gx[3 * plane_in + s->stride_w] = a31;
}

/* One input pixel of 4 input channels (ic .. ic+3, one group) with its own column taps `cols` (the borders, a
 * pixel without a partner): bwd_in_point's sums for four channels at once. gx points at gx[n][ic][ih][iw]. */
static void bwd_in_block_4x1(const et_conv2d_shape *s, const float *gy, const float *w, int n, int ic,
                             const tap_set *rows, const tap_set *cols, float *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int g = ic / cin_g, icl = ic - g * cin_g, khw = s->k_h * s->k_w;
    const long plane = (long)s->h_out * s->w_out, plane_in = (long)s->h_in * s->w_in;
    const long wst = (long)cin_g * khw; /* from one output channel's weights to the next */
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int kh, kw, oh, ow, ocl;

    for (kh = rows->first, oh = rows->o_first; kh <= rows->last; kh += rows->step, oh -= rows->o_step) {
        for (kw = cols->first, ow = cols->o_first; kw <= cols->last; kw += cols->step, ow -= cols->o_step) {
            const float *gp = gy + ((long)n * s->c_out + (long)g * cout_g) * plane + (long)oh * s->w_out + ow;
            const float *wp = w + (((long)g * cout_g * cin_g + icl) * s->k_h + kh) * s->k_w + kw;
            float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
            for (ocl = 0; ocl < cout_g; ++ocl, gp += plane, wp += wst) {
                const float v = gp[0];
                t0 = fmaf(v, wp[0], t0);
                t1 = fmaf(v, wp[khw], t1);
                t2 = fmaf(v, wp[2 * khw], t2);
                t3 = fmaf(v, wp[3 * khw], t3);
            }
            a0 += t0;
            a1 += t1;
            a2 += t2;
            a3 += t3;
        }
    }
    gx[0] = a0;
    gx[plane_in] = a1;
    gx[2 * plane_in] = a2;
    gx[3 * plane_in] = a3;
}

/* Whether input pixels iw, iw + stride_w, ..., iw + (m-1)*stride_w see the same kernel columns, each one's
 * outputs one to the right of the previous one's (true inside the image; at the borders a tap may fall off
 * one of them). The taps of one phase form one progression clipped by the output range, so the first and
 * the last pixel sharing a tap and agreeing means all do (with no tap, a pixel between them may still have
 * one). *cols receives the first pixel's taps either way. */
static int same_column_taps(const et_conv2d_shape *s, int iw, int m, tap_set *cols)
{
    const int last = iw + (m - 1) * s->stride_w;
    tap_set next;

    *cols = taps_of(iw, s->pad_w, s->dil_w, s->stride_w, s->k_w, s->w_out);
    if (last >= s->w_in)
        return 0;
    next = taps_of(last, s->pad_w, s->dil_w, s->stride_w, s->k_w, s->w_out);
    if (cols->first > cols->last)
        return m <= 2 && next.first > next.last;
    return cols->first == next.first && cols->last == next.last && next.o_first == cols->o_first + m - 1;
}

/* The interior block of one input channel: pixels iw, iw + stride_w, ..., iw + 3*stride_w, which share their
 * column taps `cols` (single channels: depthwise convolutions, a group's leftover). gx points at
 * gx[n][ic][ih][iw]. */
static void bwd_in_block_1x4(const et_conv2d_shape *s, const float *gy, const float *w, int n, int ic,
                             const tap_set *rows, const tap_set *cols, float *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int g = ic / cin_g, icl = ic - g * cin_g, sw = s->stride_w;
    const long plane = (long)s->h_out * s->w_out;
    const long wst = (long)cin_g * s->k_h * s->k_w; /* from one output channel's weights to the next */
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int kh, kw, oh, ow, ocl;

    for (kh = rows->first, oh = rows->o_first; kh <= rows->last; kh += rows->step, oh -= rows->o_step) {
        for (kw = cols->first, ow = cols->o_first; kw <= cols->last; kw += cols->step, ow -= cols->o_step) {
            const float *gp = gy + ((long)n * s->c_out + (long)g * cout_g) * plane + (long)oh * s->w_out + ow;
            const float *wp = w + (((long)g * cout_g * cin_g + icl) * s->k_h + kh) * s->k_w + kw;
            float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
            for (ocl = 0; ocl < cout_g; ++ocl, gp += plane, wp += wst) {
                const float v = wp[0];
                t0 = fmaf(gp[0], v, t0);
                t1 = fmaf(gp[1], v, t1);
                t2 = fmaf(gp[2], v, t2);
                t3 = fmaf(gp[3], v, t3);
            }
            a0 += t0;
            a1 += t1;
            a2 += t2;
            a3 += t3;
        }
    }
    gx[0] = a0;
    gx[sw] = a1;
    gx[2 * sw] = a2;
    gx[3 * sw] = a3;
}

void et_conv2d_backward_input(const et_conv2d_shape *s, const float *gy, const float *w, float *gx)
{
    const int cin_g = s->c_in / s->groups;
    const long plane_in = (long)s->h_in * s->w_in;
    int n, ic, ih, iw, p, nb;
    tap_set cols;

    for (n = 0; n < s->n; ++n) {
        for (ic = 0; ic < s->c_in; ic += nb) {
            nb = cin_g - ic % cin_g >= 4 ? 4 : 1; /* blocks of 4 channels of one group, then one by one */
            for (ih = 0; ih < s->h_in; ++ih) {
                const tap_set rows = taps_of(ih, s->pad_h, s->dil_h, s->stride_h, s->k_h, s->h_out);
                float *gr = gx + ((long)n * s->c_in + ic) * plane_in + (long)ih * s->w_in;
                /* Pixels of one phase (iw mod stride_w) in pairs: a block where both share their taps (the
                 * interior), else one pixel alone (the borders, single channels). */
                for (p = 0; p < s->stride_w && p < s->w_in; ++p) {
                    for (iw = p; iw < s->w_in;) {
                        if (same_column_taps(s, iw, nb == 4 ? 2 : 4, &cols)) {
                            if (nb == 4)
                                bwd_in_block_4x2(s, gy, w, n, ic, &rows, &cols, gr + iw);
                            else
                                bwd_in_block_1x4(s, gy, w, n, ic, &rows, &cols, gr + iw);
                            iw += (nb == 4 ? 2 : 4) * s->stride_w;
                            continue;
                        }
                        if (nb == 4) /* cols holds this pixel's own taps (same_column_taps computed them) */
                            bwd_in_block_4x1(s, gy, w, n, ic, &rows, &cols, gr + iw);
                        else
                            gr[iw] = bwd_in_point(s, gy, w, n, ic, &rows, iw);
                        iw += s->stride_w;
                    }
                }
            }
        }
    }
}
