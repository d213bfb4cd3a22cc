/* q8_conv2d_input_grad_sums.c - see q8_conv2d_input_grad_sums.h. */
#include "q8_conv2d_input_grad_sums.h"

/* The output index o (of `out`) whose tap k reads input index i, or -1: i = o*stride - pad + k*dil. */
static int source(int i, int k, int stride, int pad, int dil, int out)
{
    const int t = i + pad - k * dil;

    if (t < 0 || t % stride != 0 || t / stride >= out)
        return -1;
    return t / stride;
}

void et_q8_conv2d_backward_input_sums(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, int32_t *acc)
{
    const int cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    int n, ic, ih, iw, ocg, kh, kw;

    for (n = 0; n < s->n; ++n)
        for (ic = 0; ic < s->c_in; ++ic) {
            const int g = ic / cin_g, icg = ic % cin_g;
            for (ih = 0; ih < s->h_in; ++ih)
                for (iw = 0; iw < s->w_in; ++iw) {
                    int32_t sum = 0;
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
                                sum += gy[(((long)n * s->c_out + oc) * s->h_out + oh) * s->w_out + ow] *
                                       w[(((long)oc * cin_g + icg) * s->k_h + kh) * s->k_w + kw];
                            }
                        }
                    }
                    acc[(((long)n * s->c_in + ic) * s->h_in + ih) * s->w_in + iw] = sum;
                }
        }
}
