/*
 * linear.c - fully connected layer loops (see linear.h).
 *
 * Each output element is one accumulator over the reduced index in increasing order, each step an
 * explicit fmaf (one rounding, as torch's BLAS on FMA hardware; identical on host and Cortex-M4F), the
 * bias added last. torch's addmm/mm use a blocked, vectorized BLAS, so sums of more than one term agree
 * with it to float32 rounding; with batch 1 the weight gradient is an outer product, one multiply per
 * element, and matches exactly.
 */
#include "linear.h"

#include <math.h>
#include <stddef.h>

void et_linear_forward(int n, int in, int out, const float *x, const float *w, const float *b, float *y)
{
    int i, o, k;

    for (i = 0; i < n; ++i) {
        const float *xr = x + (long)i * in;
        for (o = 0; o < out; ++o) {
            const float *wr = w + (long)o * in;
            float acc = 0.0f;
            for (k = 0; k < in; ++k)
                acc = fmaf(xr[k], wr[k], acc);
            if (b != NULL)
                acc += b[o];
            y[(long)i * out + o] = acc;
        }
    }
}

void et_linear_backward_input(int n, int in, int out, const float *gy, const float *w, float *gx)
{
    int i, o, k;

    for (i = 0; i < n; ++i) {
        const float *gyr = gy + (long)i * out;
        for (k = 0; k < in; ++k) {
            float acc = 0.0f;
            for (o = 0; o < out; ++o)
                acc = fmaf(gyr[o], w[(long)o * in + k], acc); /* column k of W: strided, but no scratch */
            gx[(long)i * in + k] = acc;
        }
    }
}

/* dL/dW[o][k] = sum over the batch of gy[i][o] * x[i][k]; shared by the separate and fused kernels. */
static float linear_weight_grad(int n, int in, int out, const float *gy, const float *x, int o, int k)
{
    float acc = 0.0f;
    int i;

    for (i = 0; i < n; ++i)
        acc = fmaf(gy[(long)i * out + o], x[(long)i * in + k], acc);
    return acc;
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
    int o, k;

    for (o = 0; o < out; ++o)
        for (k = 0; k < in; ++k)
            gw[(long)o * in + k] = linear_weight_grad(n, in, out, gy, x, o, k);
    if (gb != NULL)
        for (o = 0; o < out; ++o)
            gb[o] = linear_bias_grad(n, out, gy, o);
}

void et_linear_wgrad_sgd(int n, int in, int out, const float *gy, const float *x, const et_sgd_params *opt,
                         float *w, float *w_buf, float *b, float *b_buf)
{
    int o, k;

    for (o = 0; o < out; ++o)
        for (k = 0; k < in; ++k) {
            const long i = (long)o * in + k;
            et_sgd_update(opt, &w[i], linear_weight_grad(n, in, out, gy, x, o, k), w_buf != NULL ? &w_buf[i] : NULL);
        }
    if (b != NULL)
        for (o = 0; o < out; ++o)
            et_sgd_update(opt, &b[o], linear_bias_grad(n, out, gy, o), b_buf != NULL ? &b_buf[o] : NULL);
}
