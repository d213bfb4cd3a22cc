/*
 * nll_loss.c - see nll_loss.h.
 */
#include "nll_loss.h"

void et_nll_loss_forward(int n, int classes, const float *logp, const int32_t *target, int ignore_index,
                         float *loss, float *total_weight)
{
    /* torch sums the picked log-probabilities in a cascade of 8 partial sums (level 0 takes each term; a
     * level is folded into the next one whenever the sample index has level_power more zero low bits),
     * then adds the levels up in order. Reproduced here so batches round alike. */
    enum { LEVELS = 8 };
    float partial[LEVELS];
    int level_power = 4, ceil_log2 = 0, counted = 0, b, j;
    float total = 0.0f;

    while ((1L << ceil_log2) < (long)n)
        ++ceil_log2;
    if (ceil_log2 / LEVELS > level_power)
        level_power = ceil_log2 / LEVELS;
    for (j = 0; j < LEVELS; ++j)
        partial[j] = 0.0f;

    for (b = 0; b < n; ++b) {
        if (target[b] == ignore_index)
            continue;
        ++counted;
        partial[0] -= logp[(long)b * classes + target[b]];
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
    *total_weight = (float)counted;
    *loss = total / *total_weight;
}

void et_nll_loss_backward(int n, int classes, const float *gy, const int32_t *target, int ignore_index,
                          const float *total_weight, float *gx)
{
    const float g = -(*gy / *total_weight);
    int b, j;

    for (b = 0; b < n; ++b) {
        float *row = gx + (long)b * classes;
        for (j = 0; j < classes; ++j)
            row[j] = 0.0f;
        if (target[b] != ignore_index)
            row[target[b]] = g;
    }
}
