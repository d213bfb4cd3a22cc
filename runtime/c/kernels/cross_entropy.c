/*
 * cross_entropy.c - see cross_entropy.h.
 *
 * The arithmetic mirrors the aten ops F.cross_entropy runs on the CPU:
 *   _log_softmax:   lsm[j] = (x[j] - max) - log(sum_k exp(x[k] - max))
 *   nll_loss (mean): loss = -(sum of lsm[label]) / count, the sum taken in torch's cascade order
 *   nll_loss_backward: g[label] = -(1 / count), 0 elsewhere
 *   _log_softmax_backward_data: gx[j] = g[j] - exp(lsm[j]) * sum_k g[k]
 * exp and log are et_expf / et_logf (et_math.h), so the host and the MCU agree bit for bit; torch uses
 * its vectorized SLEEF exp/log, so the loss and gradient agree with torch to float32 rounding.
 */
#include "cross_entropy.h"

#include "../et_math.h"

/* log(sum_k exp(x[k] - max)) and max of one row of logits. */
static float row_log_sum_exp(int classes, const float *x, float *max_out)
{
    float m = x[0], sum = 0.0f;
    int j;

    for (j = 1; j < classes; ++j)
        if (x[j] > m)
            m = x[j];
    for (j = 0; j < classes; ++j)
        sum += et_expf(x[j] - m);
    *max_out = m;
    return et_logf(sum);
}

float et_cross_entropy_forward(int n, int classes, const float *logits, const int32_t *labels)
{
    /* torch's nll_loss sums the picked log-probabilities in a cascade of 8 partial sums (level 0 takes
     * each term; a level is folded into the next one whenever the sample index has level_power more
     * zero low bits), then adds the levels up in order. Reproduced here so batches round alike. */
    enum { LEVELS = 8 };
    float partial[LEVELS];
    int level_power = 4, ceil_log2 = 0, ignored = 0, b, j;
    float total = 0.0f;

    while ((1L << ceil_log2) < (long)n)
        ++ceil_log2;
    if (ceil_log2 / LEVELS > level_power)
        level_power = ceil_log2 / LEVELS;
    for (j = 0; j < LEVELS; ++j)
        partial[j] = 0.0f;

    for (b = 0; b < n; ++b) {
        const float *x = logits + (long)b * classes;
        float m, lse;
        if (labels[b] == ET_IGNORE_INDEX) {
            ++ignored;
            continue;
        }
        lse = row_log_sum_exp(classes, x, &m);
        partial[0] -= (x[labels[b]] - m) - lse;
        for (j = 0; j + 1 < LEVELS; ++j) {
            const long mask = ((1L << level_power) - 1) << (j * level_power);
            if (((long)b & mask) != 0)
                break;
            partial[j + 1] += partial[j];
            partial[j] = 0.0f;
        }
    }
    for (j = 0; j < LEVELS; ++j)
        total += partial[j];
    return total / (float)(n - ignored);
}

void et_cross_entropy_backward(int n, int classes, const float *logits, const int32_t *labels,
                               float *grad_logits)
{
    int b, j, count = 0;
    float g;

    for (b = 0; b < n; ++b)
        if (labels[b] != ET_IGNORE_INDEX)
            ++count;
    g = -(1.0f / (float)count); /* dL/dlsm[label]; -inf if all are ignored, but then never used */

    for (b = 0; b < n; ++b) {
        const float *x = logits + (long)b * classes;
        float *gx = grad_logits + (long)b * classes;
        float m, lse, row_sum;
        if (labels[b] == ET_IGNORE_INDEX) {
            for (j = 0; j < classes; ++j)
                gx[j] = 0.0f;
            continue;
        }
        lse = row_log_sum_exp(classes, x, &m);
        row_sum = g; /* sum of this row of dL/dlsm: a single nonzero term */
        for (j = 0; j < classes; ++j) {
            const float p = et_expf((x[j] - m) - lse); /* softmax, via exp(log_softmax) as torch */
            gx[j] = (j == labels[b] ? g : 0.0f) - p * row_sum;
        }
    }
}
