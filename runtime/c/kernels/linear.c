/*
 * linear.c - fully connected layer loops (see linear.h).
 *
 * Each output element is one accumulator over the reduced index in increasing order, each step an
 * explicit fmaf (one rounding, as torch's BLAS on FMA hardware; identical on host and Cortex-M4F), the
 * bias added last. torch's addmm/mm use a blocked, vectorized BLAS, so sums of more than one term agree
 * with it to float32 rounding; with batch 1 the weight gradient is an outer product, one multiply per
 * element, and matches exactly.
 *
 * Speed: register-blocked by 4 along the dimension that is not reduced (4 outputs share each input
 * load in the forward; 4 adjacent columns of W share each gradient load in the backward), leftovers one
 * at a time. Blocking never changes the order of one element's sum, so every path gives the same bits.
 */
#include "linear.h"

#include <math.h>
#include <stddef.h>

void et_linear_forward(int n, int in, int out, const float *x, const float *w, const float *b, float *y)
{
    int i, o, k;

    for (i = 0; i < n; ++i) {
        const float *xr = x + (long)i * in;
        float *yr = y + (long)i * out;
        for (o = 0; o + 4 <= out; o += 4) { /* 4 outputs: 4 rows of W against one input row */
            const float *w0 = w + (long)o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            for (k = 0; k < in; ++k) {
                const float v = xr[k];
                a0 = fmaf(v, w0[k], a0);
                a1 = fmaf(v, w1[k], a1);
                a2 = fmaf(v, w2[k], a2);
                a3 = fmaf(v, w3[k], a3);
            }
            if (b != NULL) {
                a0 += b[o];
                a1 += b[o + 1];
                a2 += b[o + 2];
                a3 += b[o + 3];
            }
            yr[o] = a0;
            yr[o + 1] = a1;
            yr[o + 2] = a2;
            yr[o + 3] = a3;
        }
        for (; o < out; ++o) { /* leftover outputs */
            const float *wr = w + (long)o * in;
            float acc = 0.0f;
            for (k = 0; k < in; ++k)
                acc = fmaf(xr[k], wr[k], acc);
            yr[o] = b != NULL ? acc + b[o] : acc;
        }
    }
}

void et_linear_backward_input(int n, int in, int out, const float *gy, const float *w, float *gx)
{
    int i, o, k;

    for (i = 0; i < n; ++i) {
        const float *gyr = gy + (long)i * out;
        float *gxr = gx + (long)i * in;
        for (k = 0; k + 4 <= in; k += 4) { /* 4 adjacent columns of W, read row by row */
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            const float *wc = w + k;
            for (o = 0; o < out; ++o, wc += in) {
                const float g = gyr[o];
                a0 = fmaf(g, wc[0], a0);
                a1 = fmaf(g, wc[1], a1);
                a2 = fmaf(g, wc[2], a2);
                a3 = fmaf(g, wc[3], a3);
            }
            gxr[k] = a0;
            gxr[k + 1] = a1;
            gxr[k + 2] = a2;
            gxr[k + 3] = a3;
        }
        for (; k < in; ++k) { /* leftover columns */
            float acc = 0.0f;
            for (o = 0; o < out; ++o)
                acc = fmaf(gyr[o], w[(long)o * in + k], acc);
            gxr[k] = acc;
        }
    }
}

/* dL/dW[o][k .. k+nb-1] = sum over the batch of gy[i][o] * x[i][k + j] (nb = 4, or 1 for a leftover). */
static void linear_weight_grad(int n, int in, int out, const float *gy, const float *x, int o, int k, int nb,
                               float g[4])
{
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int i;

    if (nb == 4) {
        for (i = 0; i < n; ++i) {
            const float v = gy[(long)i * out + o];
            const float *xr = x + (long)i * in + k;
            a0 = fmaf(v, xr[0], a0);
            a1 = fmaf(v, xr[1], a1);
            a2 = fmaf(v, xr[2], a2);
            a3 = fmaf(v, xr[3], a3);
        }
    } else {
        for (i = 0; i < n; ++i)
            a0 = fmaf(gy[(long)i * out + o], x[(long)i * in + k], a0);
    }
    g[0] = a0;
    g[1] = a1;
    g[2] = a2;
    g[3] = a3;
}

static float linear_bias_grad(int n, int out, const float *gy, int o)
{
    float acc = 0.0f;
    int i;

    for (i = 0; i < n; ++i)
        acc += gy[(long)i * out + o];
    return acc;
}

void et_linear_backward_weight(int n, int in, int out, const float *gy, const float *x, float *gw, float *gb)
{
    float g[4];
    int o, k, j, nb;

    for (o = 0; o < out; ++o)
        for (k = 0; k < in; k += nb) {
            nb = in - k >= 4 ? 4 : 1;
            linear_weight_grad(n, in, out, gy, x, o, k, nb, g);
            for (j = 0; j < nb; ++j)
                gw[(long)o * in + k + j] = g[j];
        }
    if (gb != NULL)
        for (o = 0; o < out; ++o)
            gb[o] = linear_bias_grad(n, out, gy, o);
}

void et_linear_wgrad_sgd(int n, int in, int out, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf)
{
    float g[4];
    int o, k, j, nb;

    for (o = 0; w != NULL && o < out; ++o)
        for (k = 0; k < in; k += nb) {
            nb = in - k >= 4 ? 4 : 1;
            linear_weight_grad(n, in, out, gy, x, o, k, nb, g);
            for (j = 0; j < nb; ++j) {
                const long i = (long)o * in + k + j;
                et_sgd_update(opt, &w[i], g[j], w_buf != NULL ? &w_buf[i] : NULL);
            }
        }
    if (b != NULL)
        for (o = 0; o < out; ++o)
            et_sgd_update(opt, &b[o], linear_bias_grad(n, out, gy, o), b_buf != NULL ? &b_buf[o] : NULL);
}
