/* q8_conv2d_input_grad.c - see q8_conv2d_input_grad.h. */
#include "q8_conv2d_input_grad.h"

int et_q8_conv2d_input_grad_col_bytes(const et_conv2d_shape *s)
{
    return s->c_out / s->groups * s->k_h * s->k_w;
}

/* The output index o (of `out`) whose tap k reads input index i, or -1: i = o*stride - pad + k*dil. */
static int source(int i, int k, int stride, int pad, int dil, int out)
{
    const int t = i + pad - k * dil;

    if (t < 0 || t % stride != 0 || t / stride >= out)
        return -1;
    return t / stride;
}

void et_q8_conv2d_backward_input_ref(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                     const et_q8_requant *q, int8_t *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    int n, ic, ih, iw, ocg, kh, kw;

    for (n = 0; n < s->n; ++n)
        for (ic = 0; ic < s->c_in; ++ic) {
            const int g = ic / cin_g, icg = ic % cin_g;
            for (ih = 0; ih < s->h_in; ++ih)
                for (iw = 0; iw < s->w_in; ++iw) {
                    int32_t acc = 0;
                    for (ocg = 0; ocg < cout_g; ++ocg) {
                        const int oc = g * cout_g + ocg;
                        for (kh = 0; kh < s->k_h; ++kh) {
                            const int oh = source(ih, kh, s->stride_h, s->pad_h, s->dil_h, s->h_out);
                            if (oh < 0)
                                continue;
                            for (kw = 0; kw < s->k_w; ++kw) {
                                const int ow = source(iw, kw, s->stride_w, s->pad_w, s->dil_w, s->w_out);
                                if (ow < 0)
                                    continue;
                                acc += gy[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow] *
                                       w[(((long)oc * cin_g + icg) * s->k_h + kh) * s->k_w + kw];
                            }
                        }
                    }
                    gx[(((long)n * s->c_in + ic) * s->h_in + ih) * s->w_in + iw] = et_q8_output(q, ic, acc);
                }
        }
}

#if ET_Q8_FAST
/* The gradients input pixel (ih, iw) of group g reads, as col[(ocg, kh, kw)] in w's order (0 where no
 * output reads it through that tap). */
static void gather_sources(const et_conv2d_shape *s, const int8_t *gyg, int ih, int iw, int8_t *col)
{
    const int cout_g = s->c_out / s->groups, taps = s->k_h * s->k_w;
    const long plane = (long)s->h_out * s->w_out;
    int ocg, kh, kw;

    for (kh = 0; kh < s->k_h; ++kh) {
        const int oh = source(ih, kh, s->stride_h, s->pad_h, s->dil_h, s->h_out);
        for (kw = 0; kw < s->k_w; ++kw) {
            const int ow = oh < 0 ? -1 : source(iw, kw, s->stride_w, s->pad_w, s->dil_w, s->w_out);
            const int8_t *src = gyg + (long)oh * s->w_out + ow;
            int8_t *dst = col + kh * s->k_w + kw;
            for (ocg = 0; ocg < cout_g; ++ocg)
                dst[ocg * taps] = ow < 0 ? 0 : src[ocg * plane];
        }
    }
}

/* Per input pixel: its gradients gathered once; then a 1x1 kernel sums four input channels at a time down
 * the weight matrix's columns (et_q8_colsum4), a larger one dots each output channel's taps with the
 * weights' (contiguous) taps for that input channel (et_q8_dot). */
void et_q8_conv2d_backward_input(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int8_t *col, int8_t *gx)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups, taps = s->k_h * s->k_w;
    const long plane_in = (long)s->h_in * s->w_in;
    int n, g, ih, iw, icg, ocg;

    for (n = 0; n < s->n; ++n)
        for (g = 0; g < s->groups; ++g) {
            const int8_t *gyg = gy + ((long)n * s->c_out + (long)g * cout_g) * s->h_out * s->w_out;
            const int8_t *wg = w + (long)g * cout_g * cin_g * taps;
            int8_t *gxg = gx + ((long)n * s->c_in + (long)g * cin_g) * plane_in;
            for (ih = 0; ih < s->h_in; ++ih)
                for (iw = 0; iw < s->w_in; ++iw) {
                    const long p = (long)ih * s->w_in + iw;
                    gather_sources(s, gyg, ih, iw, col);
                    icg = 0;
                    if (taps == 1)
                        for (; icg + 4 <= cin_g; icg += 4) {
                            int32_t acc[4] = {0, 0, 0, 0};
                            int j;
                            et_q8_colsum4(col, wg + icg, cin_g, cout_g, acc);
                            for (j = 0; j < 4; ++j)
                                gxg[(icg + j) * plane_in + p] = et_q8_output(q, g * cin_g + icg + j, acc[j]);
                        }
                    for (; icg < cin_g; ++icg) {
                        int32_t acc = 0;
                        for (ocg = 0; ocg < cout_g; ++ocg)
                            acc = et_q8_dot(col + ocg * taps, 0, wg + ((long)ocg * cin_g + icg) * taps, taps, acc);
                        gxg[icg * plane_in + p] = et_q8_output(q, g * cin_g + icg, acc);
                    }
                }
        }
}
#else
void et_q8_conv2d_backward_input(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int8_t *col, int8_t *gx)
{
    (void)col;
    et_q8_conv2d_backward_input_ref(s, gy, w, q, gx);
}
#endif
