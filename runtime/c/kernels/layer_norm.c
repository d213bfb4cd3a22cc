/* layer_norm.c - see layer_norm.h. */
#include "layer_norm.h"

#include <math.h>
#include <stddef.h>

void et_layer_norm_forward(int rows, int cols, const float *x, const float *w, const float *b, double eps,
                           float *y, float *mean, float *rstd)
{
    long r;
    int j;

    for (r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double sum = 0.0, sq = 0.0;
        float m, var, rs, shift;

        /* Two passes in double: the mean and variance come out within one rounding of the exact ones. */
        for (j = 0; j < cols; ++j)
            sum += xr[j];
        m = (float)(sum / cols);
        for (j = 0; j < cols; ++j) {
            const double d = (double)xr[j] - m;
            sq += d * d;
        }
        var = (float)(sq / cols);
        rs = (float)(1.0 / sqrt((double)(var > 0.0f ? var : 0.0f) + eps));
        shift = -m * rs;
        for (j = 0; j < cols; ++j)
            yr[j] = (xr[j] * rs + shift) * (w != NULL ? w[j] : 1.0f) + (b != NULL ? b[j] : 0.0f);
        if (mean != NULL) /* NULL: no backward reads them (inference, a frozen prefix, a recompute) */
            mean[r] = m;
        if (rstd != NULL)
            rstd[r] = rs;
    }
}

/* gx of every row: reads this step's weight, so it runs before any update of it. */
static void ln_grad_input(int rows, int cols, const float *gy, const float *x, const float *mean, const float *rstd,
                          const float *w, float *gx)
{
    const float s = 1.0f / (float)cols;
    long r;
    int j;

    for (r = 0; r < rows; ++r) {
        const float *xr = x + r * cols, *gr = gy + r * cols;
        const float m = mean[r], a = rstd[r];
        float ds = 0.0f, db = 0.0f, bb, cc;
        for (j = 0; j < cols; ++j) {
            const float g = gr[j] * (w != NULL ? w[j] : 1.0f);
            ds += g * xr[j];
            db += g;
        }
        bb = (db * m - ds) * a * a * a * s;
        cc = -bb * m - db * a * s;
        for (j = 0; j < cols; ++j)
            gx[r * cols + j] = a * gr[j] * (w != NULL ? w[j] : 1.0f) + bb * xr[j] + cc;
    }
}

/* Column j's parameter gradients: sums over the rows, first row first. */
static void ln_param_sums(int rows, int cols, int j, const float *gy, const float *x, const float *mean,
                          const float *rstd, float *sw, float *sb)
{
    long r;

    *sw = 0.0f;
    *sb = 0.0f;
    for (r = 0; r < rows; ++r) {
        const float g = gy[r * cols + j];
        *sw += g * (x[r * cols + j] - mean[r]) * rstd[r];
        *sb += g;
    }
}

void et_layer_norm_backward(int rows, int cols, const float *gy, const float *x, const float *mean,
                            const float *rstd, const float *w, float *gx, float *gw, float *gb)
{
    int j;

    if (gx != NULL)
        ln_grad_input(rows, cols, gy, x, mean, rstd, w, gx);
    if (gw == NULL && gb == NULL)
        return;
    for (j = 0; j < cols; ++j) {
        float sw, sb;
        ln_param_sums(rows, cols, j, gy, x, mean, rstd, &sw, &sb);
        if (gw != NULL)
            gw[j] = sw;
        if (gb != NULL)
            gb[j] = sb;
    }
}

void et_layer_norm_backward_sgd(int rows, int cols, const float *gy, const float *x, const float *mean,
                                const float *rstd, const et_sgd_params *opt, float *gx, float *w, float *w_buf,
                                float *b, float *b_buf)
{
    int j;

    if (gx != NULL) /* all of it before the first update: every row reads this step's weight */
        ln_grad_input(rows, cols, gy, x, mean, rstd, w, gx);
    if (w == NULL && b == NULL)
        return;
    for (j = 0; j < cols; ++j) {
        float sw, sb;
        ln_param_sums(rows, cols, j, gy, x, mean, rstd, &sw, &sb);
        if (w != NULL)
            et_sgd_update(opt, &w[j], sw, w_buf != NULL ? &w_buf[j] : NULL);
        if (b != NULL)
            et_sgd_update(opt, &b[j], sb, b_buf != NULL ? &b_buf[j] : NULL);
    }
}
