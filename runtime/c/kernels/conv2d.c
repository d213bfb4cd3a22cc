/*
 * conv2d.c - direct convolution loops (see conv2d.h).
 *
 * Every output element is one accumulator, summed in a fixed order and written once; there is no im2col
 * (it would need a scratch buffer as large as the unfolded input), so the result is the same on every
 * target and easy to audit. Padding taps are skipped, not multiplied by zero.
 *
 * Speed: the border is split from the interior. For each output row (or, in the input gradient, input
 * row) the range of kernel rows that stay inside the image is computed once; columns are split into a left
 * border, an interior where every kernel column is inside, and a right border. The interior runs
 * register-blocked kernels - forward: 4 output channels x 2 output pixels (8 accumulators; each tap loads 2
 * inputs and 4 weights for 8 multiply-adds), input gradient: 4 input channels x 2 input pixels, weight
 * gradient: 4 output channels x 2 input channels - with no bounds check, `%` or division in their loops;
 * the forward's 3-wide stride-1 rows (3x3 convolutions) are unrolled, the two pixels sharing 4 input loads,
 * and a pointwise (1x1) forward runs one loop over input channels instead of three nested ones.
 * Border pixels, an odd pixel and a group's last input channel run 4 x 1 blocks over the same precomputed
 * (clipped) ranges. Channels left over from blocks of 4 (all of a depthwise convolution's) run 1 channel x 4
 * pixels in the interior of the forward and the input gradient, and one element at a time elsewhere; their
 * weight gradient is one pass over the plane per weight, which is already a long plain loop.
 * Blocking changes which outputs are computed together, never the order of one output's sum, so every
 * path gives the same bits.
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

/* Taps k in [*lo, *hi) of a window whose tap 0 reads input index `base` (step `dil`, `k` taps) that land
 * inside [0, in). */
static void tap_range(int base, int dil, int k, int in, int *lo, int *hi)
{
    int a = 0, b = k;

    if (base < 0)
        a = (-base + dil - 1) / dil;
    if (base + (k - 1) * dil > in - 1)
        b = in - 1 - base < 0 ? 0 : (in - 1 - base) / dil + 1;
    *lo = a;
    *hi = b > a ? b : a;
}

/* Outputs o in [*lo, *hi) (of `out`) whose whole window - input indices o*stride + first .. o*stride + last -
 * lies inside [0, in): the interior. */
static void interior(int first, int last, int stride, int in, int out, int *lo, int *hi)
{
    int a = first < 0 ? (-first + stride - 1) / stride : 0;
    int b = in - 1 - last < 0 ? 0 : (in - 1 - last) / stride + 1;

    b = b < out ? b : out;
    *lo = a < b ? a : b;
    *hi = b > *lo ? b : *lo;
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

/* -- input gradient ----------------------------------------------------------------------------------- */

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

/* -- weight gradient ---------------------------------------------------------------------------------- */

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
