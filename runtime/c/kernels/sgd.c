/*
 * sgd.c - the SGD update (see sgd.h).
 *
 * Rounding: torch computes `grad.add(param, alpha=wd)` and `param.add_(buf, alpha=-lr)` with its add
 * kernel, which evaluates `self + alpha * other` as one fused multiply-add (one rounding) on every CPU
 * with FMA; `buf.mul_(momentum).add_(d)` is two ops, two roundings. fmaf() reproduces that bit for bit.
 * fmaf is correctly rounded by C99's definition, so the result is also the same on every target: on the
 * Cortex-M4F GCC emits the VFMA.F32 instruction, on x86-64 without -mfma glibc's exact fmaf (link -lm).
 * -ffp-contract=off keeps the compiler from fusing anything else.
 */
#include "sgd.h"

#include <math.h>
#include <stddef.h>

void et_sgd_update(const et_sgd_params *opt, float *p, float g, float *buf)
{
    float d = g;

    if (opt->weight_decay != 0.0f)
        d = fmaf(opt->weight_decay, *p, d);
    if (opt->momentum != 0.0f) {
        *buf = *buf * opt->momentum + d;
        d = *buf;
    }
    *p = fmaf(-opt->lr, d, *p);
}

void et_sgd_step(const et_sgd_params *opt, int count, float *p, const float *g, float *buf)
{
    int i;

    for (i = 0; i < count; ++i)
        et_sgd_update(opt, &p[i], g[i], buf != NULL ? &buf[i] : NULL);
}
