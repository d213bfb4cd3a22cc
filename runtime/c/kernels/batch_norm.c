/*
 * batch_norm.c - see batch_norm.h. fmaf where torch's compiled kernel fuses a multiply and an add
 * (found by comparing bits), explicit (double) where torch accumulates or mixes in double.
 */
#include "batch_norm.h"

#include <math.h>
#include <stddef.h>

void et_batch_norm_eval(int n, int c, int hw, const float *x, const float *w, const float *b,
                        const float *running_mean, const float *running_var, double eps, float *y)
{
    const long stride = (long)c * hw;
    int ch, i;
    long p;

    for (ch = 0; ch < c; ++ch) {
        /* The training forward's folding, with the running statistics for the batch's. */
        const float invstd = (float)(1.0 / sqrt((double)running_var[ch] + eps));
        const float alpha = w != NULL ? invstd * w[ch] : invstd;
        const float beta = fmaf(-running_mean[ch], alpha, b != NULL ? b[ch] : 0.0f);
        for (p = 0; p < n; ++p)
            for (i = 0; i < hw; ++i)
                y[p * stride + (long)ch * hw + i] = fmaf(x[p * stride + (long)ch * hw + i], alpha, beta);
    }
}

void et_batch_norm_forward(int n, int c, int hw, const float *x, const float *w, const float *b, double eps,
                           float *y, float *save_mean, float *save_invstd, float *var_sum)
{
    const long count = (long)n * hw;
    const long stride = (long)c * hw;
    int ch, i;
    long p;

    for (ch = 0; ch < c; ++ch) {
        const float *xc = x + (long)ch * hw;
        float *yc = y + (long)ch * hw;
        double sum = 0.0, sq = 0.0;
        float mean, vs, invstd, alpha, beta;

        /* Two passes (mean, then squared deviations from the float mean), both in double: torch's order. */
        for (p = 0; p < n; ++p)
            for (i = 0; i < hw; ++i)
                sum += xc[p * stride + i];
        mean = (float)(sum / (double)count);
        for (p = 0; p < n; ++p)
            for (i = 0; i < hw; ++i) {
                const float d = xc[p * stride + i] - mean;
                sq += d * d;
            }
        vs = (float)sq;
        /* The biased variance is a float division; 1/sqrt in double, rounded once to float. */
        invstd = (float)(1.0 / sqrt((double)(vs / (float)count) + eps));
        save_mean[ch] = mean;
        save_invstd[ch] = invstd;
        if (var_sum != NULL)
            var_sum[ch] = vs;

        /* y = (x - mean) * invstd * w + b, folded into one multiply-add per element. */
        alpha = w != NULL ? invstd * w[ch] : invstd;
        beta = fmaf(-mean, alpha, b != NULL ? b[ch] : 0.0f);
        for (p = 0; p < n; ++p)
            for (i = 0; i < hw; ++i)
                yc[p * stride + i] = fmaf(xc[p * stride + i], alpha, beta);
    }
}

void et_batch_norm_update_running_stats(int c, long count, float momentum, const float *save_mean,
                                        const float *var_sum, float *running_mean, float *running_var)
{
    const float keep = 1.0f - momentum;
    int ch;

    for (ch = 0; ch < c; ++ch) {
        /* Mean: float products and sum (not fused). Variance: the unbiased value is a float division, its
         * product with momentum and the sum are double, the other product float - torch's types. */
        const float unbiased = var_sum[ch] / (float)(count - 1);
        running_mean[ch] = momentum * save_mean[ch] + keep * running_mean[ch];
        running_var[ch] = (float)((double)momentum * (double)unbiased + (double)(keep * running_var[ch]));
    }
}

/* Per channel: sum of gy and of (x - mean) * gy, each [hw] plane in float, the planes added in double. */
static void bn_sums(int n, int c, int hw, int ch, const float *gy, const float *x, float mean,
                    double *sum_out, double *dotp_out)
{
    const long stride = (long)c * hw;
    double sum = 0.0, dotp = 0.0;
    long p;
    int i;

    for (p = 0; p < n; ++p) {
        const float *xp = x + p * stride + (long)ch * hw;
        const float *gp = gy + p * stride + (long)ch * hw;
        float s = 0.0f, d = 0.0f;
        for (i = 0; i < hw; ++i) {
            s += gp[i];
            d += (xp[i] - mean) * gp[i];
        }
        sum += s;
        dotp += d;
    }
    *sum_out = sum;
    *dotp_out = dotp;
}

static void bn_grad_input(int n, int c, int hw, int ch, const float *gy, const float *x, float mean,
                          float invstd, float w, double sum, double dotp, float *gx)
{
    const long count = (long)n * hw;
    const long stride = (long)c * hw;
    const float k = (float)dotp * invstd * invstd / (float)count;
    const float grad_mean = (float)(sum / (double)count);
    long p;
    int i;

    for (p = 0; p < n; ++p) {
        const long off = p * stride + (long)ch * hw;
        /* (gy - grad_mean - (x - mean) * k) * invstd * w, the (x - mean) * k fused into the subtraction. */
        for (i = 0; i < hw; ++i)
            gx[off + i] = fmaf(-(x[off + i] - mean), k, gy[off + i] - grad_mean) * invstd * w;
    }
}

void et_batch_norm_backward(int n, int c, int hw, const float *gy, const float *x, const float *w,
                            const float *save_mean, const float *save_invstd, float *gx, float *gw, float *gb)
{
    int ch;

    for (ch = 0; ch < c; ++ch) {
        double sum, dotp;
        bn_sums(n, c, hw, ch, gy, x, save_mean[ch], &sum, &dotp);
        if (gx != NULL)
            bn_grad_input(n, c, hw, ch, gy, x, save_mean[ch], save_invstd[ch], w != NULL ? w[ch] : 1.0f, sum,
                          dotp, gx);
        if (gw != NULL)
            gw[ch] = (float)(dotp * save_invstd[ch]);
        if (gb != NULL)
            gb[ch] = (float)sum;
    }
}

void et_batch_norm_backward_sgd(int n, int c, int hw, const float *gy, const float *x, const float *save_mean,
                                const float *save_invstd, const et_sgd_params *opt, float *gx,
                                float *w, float *w_buf, float *b, float *b_buf)
{
    int ch;

    for (ch = 0; ch < c; ++ch) {
        double sum, dotp;
        bn_sums(n, c, hw, ch, gy, x, save_mean[ch], &sum, &dotp);
        if (gx != NULL) /* before the update: the input gradient needs this step's weight */
            bn_grad_input(n, c, hw, ch, gy, x, save_mean[ch], save_invstd[ch], w != NULL ? w[ch] : 1.0f, sum,
                          dotp, gx);
        if (w != NULL)
            et_sgd_update(opt, &w[ch], (float)(dotp * save_invstd[ch]), w_buf != NULL ? &w_buf[ch] : NULL);
        if (b != NULL)
            et_sgd_update(opt, &b[ch], (float)sum, b_buf != NULL ? &b_buf[ch] : NULL);
    }
}
