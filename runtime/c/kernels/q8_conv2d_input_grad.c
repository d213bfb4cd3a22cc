/* q8_conv2d_input_grad.c - see q8_conv2d_input_grad.h. */
#include "q8_conv2d_input_grad.h"
#include "q8_conv2d_input_grad_sums.h"

int et_q8_conv2d_input_grad_scratch_size(const et_conv2d_shape *s)
{
    const int len = s->c_out / s->groups * s->k_h * s->k_w;
    return 2 * len + (s->c_in / s->groups * len + 1) / 2; /* two pixels' columns, then a group's weights transposed */
}

void et_q8_conv2d_backward_input_ref(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                     const et_q8_requant *q, int8_t *gx)
{
    int n, ic, ih, iw;

    for (n = 0; n < s->n; ++n)
        for (ic = 0; ic < s->c_in; ++ic)
            for (ih = 0; ih < s->h_in; ++ih)
                for (iw = 0; iw < s->w_in; ++iw)
                    gx[(((long)n * s->c_in + ic) * s->h_in + ih) * s->w_in + iw] =
                        et_q8_output(q, ic, et_q8_input_grad_sum(s, gy, w, n, ic, ih, iw));
}

#if ET_Q8_FAST
/* Whether kernel tap k reads input index i through some output (ignoring the borders): (i + pad - k*dil) a multiple
 * of the stride. It depends on i only modulo the stride: the input's stride phase. */
static int tap_in_phase(int i, int k, int stride, int pad, int dil)
{
    return (i + pad - k * dil) % stride == 0;
}

/* The gradients input pixel (ih, iw) reads, as int16 col[(tap, ocg)], tap-major over the taps of the pixel's stride
 * phase (0 where the tap's output is off the map): the weights of the phase are laid out to match (wt below). */
static void gather_sources(const et_conv2d_shape *s, const int8_t *gyg, int ih, int iw, int16_t *col)
{
    /* the shape in locals: the stores below may alias *s for the compiler */
    const int cout_g = s->c_out / s->groups, k_h = s->k_h, k_w = s->k_w, h_out = s->h_out, w_out = s->w_out;
    const int sh = s->stride_h, sw = s->stride_w, ph = s->pad_h, pw = s->pad_w, dh = s->dil_h, dw = s->dil_w;
    const long plane = (long)h_out * w_out;
    int kh, kw, ocg;

    for (kh = 0; kh < k_h; ++kh) {
        const int th = ih + ph - kh * dh, oh = th / sh;
        if (th % sh != 0)
            continue;
        for (kw = 0; kw < k_w; ++kw) {
            const int tw = iw + pw - kw * dw, ow = tw / sw;
            if (tw % sw != 0)
                continue;
            if (th >= 0 && oh < h_out && tw >= 0 && ow < w_out) {
                const int8_t *src = gyg + (long)oh * w_out + ow;
                for (ocg = 0; ocg < cout_g; ++ocg, src += plane)
                    *col++ = *src;
            } else
                for (ocg = 0; ocg < cout_g; ++ocg)
                    *col++ = 0;
        }
    }
}

#define DW_MAX_KH 8 /* kernel rows the depthwise path keeps packed in registers (taller kernels: the general path) */

/* Depthwise (one input and one output channel per group), stride and dilation 1, 3-wide kernel rows: the input
 * gradient is the gradient correlated with the kernel turned around, so each kernel row of a pixel is one
 * et_q8_row3, the rows' weights packed (turned) once per channel. A pixel whose first or last source falls off
 * the row takes the packing with that tap's weight 0 (the byte read there, inside the tensor, counts 0); other
 * pixels go tap by tap. */
static void depthwise3(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, const et_q8_requant *q,
                       int8_t *gx)
{
    const long gy_size = (long)s->n * s->c_out * s->h_out * s->w_out;
    uint32_t w20[3][DW_MAX_KH]; /* all taps; the first source off the row; the last one off */
    int32_t w1[DW_MAX_KH];
    int n, c, ih, iw, kh, kw;

    for (n = 0; n < s->n; ++n)
        for (c = 0; c < s->c_in; ++c) {
            const long gyc = ((long)n * s->c_out + c) * s->h_out * s->w_out; /* the channel's plane */
            const int8_t *wc = w + (long)c * s->k_h * 3;
            int8_t *gxc = gx + ((long)n * s->c_in + c) * s->h_in * s->w_in;
            for (kh = 0; kh < s->k_h; ++kh) {
                w20[0][kh] = et_q8_pack_lo((uint32_t)wc[3 * kh + 2], (uint32_t)wc[3 * kh]);
                w20[1][kh] = et_q8_pack_lo(0u, (uint32_t)wc[3 * kh]);
                w20[2][kh] = et_q8_pack_lo((uint32_t)wc[3 * kh + 2], 0u);
                w1[kh] = wc[3 * kh + 1];
            }
            for (ih = 0; ih < s->h_in; ++ih) {
                /* the kernel rows kh whose output row oh = ih + pad_h - kh exists */
                const int kh0 = ih + s->pad_h - (s->h_out - 1) > 0 ? ih + s->pad_h - (s->h_out - 1) : 0;
                const int kh1 = ih + s->pad_h + 1 < s->k_h ? ih + s->pad_h + 1 : s->k_h;
                for (iw = 0; iw < s->w_in; ++iw) {
                    const int ow0 = iw + s->pad_w - 2; /* the output whose tap 2 reads iw */
                    const long top = gyc + (long)(ih + s->pad_h - kh0) * s->w_out + ow0; /* gy's index, row kh0 */
                    const long first = top - (long)(kh1 - 1 - kh0) * s->w_out; /* row kh1 - 1's: the lowest read */
                    const int side = ow0 < 0 ? 1 : ow0 + 2 >= s->w_out ? 2 : 0;
                    const int8_t *gr;
                    int32_t acc = 0;
                    if (kh0 < kh1 && ow0 >= -1 && ow0 + 1 < s->w_out && !(ow0 < 0 && ow0 + 2 >= s->w_out) &&
                        first >= 0 && top + 3 < gy_size) {
                        const uint32_t *wp = w20[side];
                        gr = gy + top;
                        for (kh = kh0; kh < kh1; ++kh, gr -= s->w_out)
                            acc = et_q8_row3(gr, 0u, wp[kh], w1[kh], acc);
                    } else
                        for (kh = kh0; kh < kh1; ++kh)
                            for (kw = 0; kw < 3; ++kw)
                                if (ow0 + 2 - kw >= 0 && ow0 + 2 - kw < s->w_out)
                                    acc += gy[gyc + (long)(ih + s->pad_h - kh) * s->w_out + ow0 + 2 - kw] * wc[3 * kh + kw];
                    gxc[(long)ih * s->w_in + iw] = et_q8_output(q, c, acc);
                }
            }
        }
}

/* The weights of stride phase (a, b) of group g, transposed: row icg holds w[:, icg, kh, kw] over the phase's taps,
 * tap-major as gather_sources lays the column out, each whole quad's bytes stored (0, 2, 1, 3) (et_q8_col_pos) so
 * that SXTB16 of a word gives the weights of the column's first int16 pair and its rotation the second. Returns
 * the row length. */
static int phase_weights(const et_conv2d_shape *s, const int8_t *w, int g, int a, int b, int8_t *wt)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, taps = s->k_h * s->k_w;
    int kh, kw, ocg, icg, len = 0, j;

    for (kh = 0; kh < s->k_h; ++kh)
        for (kw = 0; kw < s->k_w; ++kw)
            len += tap_in_phase(a, kh, s->stride_h, s->pad_h, s->dil_h) && tap_in_phase(b, kw, s->stride_w, s->pad_w, s->dil_w)
                       ? cout_g : 0;
    for (icg = 0; icg < cin_g; ++icg) {
        j = 0;
        for (kh = 0; kh < s->k_h; ++kh)
            for (kw = 0; kw < s->k_w; ++kw) {
                if (!tap_in_phase(a, kh, s->stride_h, s->pad_h, s->dil_h) || !tap_in_phase(b, kw, s->stride_w, s->pad_w, s->dil_w))
                    continue;
                for (ocg = 0; ocg < cout_g; ++ocg, ++j)
                    wt[(long)icg * len + et_q8_col_pos(j, len)] =
                        w[(((long)g * cout_g + ocg) * cin_g + icg) * taps + kh * s->k_w + kw];
            }
    }
    return len;
}

/* The forward's scheme on the transposed problem, one stride phase at a time: an input pixel reads only the taps
 * of its phase (a stride-2 kernel: a quarter of them), so the pixels of a phase share one transposed weight matrix
 * (phase_weights, in the scratch) and gather only those taps' gradients. Two pixels of the phase are gathered
 * (int16), then two input channels at a time run against them (et_q8_mac_2x2). Stride 1 is one phase. */
void et_q8_conv2d_backward_input(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int16_t *scratch, int8_t *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    const int w_in = s->w_in, sh = s->stride_h, sw = s->stride_w;
    const int len_max = cout_g * s->k_h * s->k_w;
    const long plane_in = (long)s->h_in * w_in;
    const et_q8_requant qq = *q; /* a local copy: the int8 stores below may alias *q for the compiler */
    int8_t *wt = (int8_t *)(scratch + 2 * len_max);
    int n, g, icg, a, b, j;

    if (cin_g == 1 && cout_g == 1 && s->k_w == 3 && s->k_h <= DW_MAX_KH && sh == 1 && sw == 1 && s->dil_h == 1 &&
        s->dil_w == 1) {
        depthwise3(s, gy, w, q, gx);
        return;
    }
    for (g = 0; g < s->groups; ++g)
        for (a = 0; a < sh && a < s->h_in; ++a)
            for (b = 0; b < sw && b < w_in; ++b) {
                const int len = phase_weights(s, w, g, a, b, wt);
                const int rows = (s->h_in - a + sh - 1) / sh, cols = (w_in - b + sw - 1) / sw; /* the phase's pixels */
                const long count = (long)rows * cols;
                long k;
                for (n = 0; n < s->n; ++n) {
                    const int8_t *gyg = gy + ((long)n * s->c_out + (long)g * cout_g) * s->h_out * s->w_out;
                    int8_t *gxg = gx + ((long)n * s->c_in + (long)g * cin_g) * plane_in;
                    for (k = 0; k < count; k += 2) {
                        const int two = k + 1 < count;
                        const long p0 = (long)(a + (int)(k / cols) * sh) * w_in + b + (int)(k % cols) * sw;
                        const long p1 = two ? (long)(a + (int)((k + 1) / cols) * sh) * w_in + b + (int)((k + 1) % cols) * sw : p0;
                        int16_t *c0 = scratch, *c1 = two ? scratch + len_max : scratch;
                        gather_sources(s, gyg, (int)(p0 / w_in), (int)(p0 % w_in), c0);
                        if (two)
                            gather_sources(s, gyg, (int)(p1 / w_in), (int)(p1 % w_in), c1);
                        for (icg = 0; icg < cin_g; icg += 2) {
                            const int pair = icg + 1 < cin_g ? 2 : 1;
                            const int8_t *w0 = wt + (long)icg * len;
                            int32_t acc[4] = {0, 0, 0, 0};
                            int8_t *g0 = gxg + icg * plane_in;
                            et_q8_mac_2x2(c0, c1, w0, pair == 2 ? w0 + len : w0, len, acc);
                            for (j = 0; j < pair; ++j, g0 += plane_in) {
                                g0[p0] = et_q8_output(&qq, g * cin_g + icg + j, acc[2 * j]);
                                if (two)
                                    g0[p1] = et_q8_output(&qq, g * cin_g + icg + j, acc[2 * j + 1]);
                            }
                        }
                    }
                }
            }
}
#else
void et_q8_conv2d_backward_input(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int16_t *scratch, int8_t *gx)
{
    (void)scratch;
    et_q8_conv2d_backward_input_ref(s, gy, w, q, gx);
}
#endif
