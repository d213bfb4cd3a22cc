/*
 * et_math.h - exp and log (the loss, sigmoid, SiLU), tanh and erf (GELU), written with + - * / only
 * (and fmaf, which C99 defines as correctly rounded).
 *
 * Why not <math.h>'s expf/logf: the host's glibc and the Cortex-M's newlib implement them differently
 * (newlib on a single-precision-only FPU uses the old fdlibm float code, glibc a newer double-based one),
 * so their last bits differ and a training step would no longer give bit-identical weights on the host
 * and on the MCU. These functions use only IEEE-754 single-precision basic operations, which every C99
 * compiler with FLT_EVAL_METHOD == 0 evaluates identically (given -ffp-contract=off, so that no multiply
 * and add get fused on one target but not on another). Accuracy: exp and log under 1 ulp over the range
 * the loss uses (tests/test_c_kernels.py); tanh and erf a few ulp (tests/test_c_kernels_mcu.py).
 */
#ifndef ET_MATH_H
#define ET_MATH_H

/* e^x. Overflow gives +inf (x > 88.72), underflow 0 (x < -103.97, subnormals in between), NaN stays NaN. */
float et_expf(float x);

/* Natural log. log(+0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN stays NaN. */
float et_logf(float x);

/* tanh(x); +-1 for |x| > 9, NaN stays NaN. */
float et_tanhf(float x);

/* The error function; +-1 for |x| >= 4, NaN stays NaN. Up to ~60 series terms near |x| = 4. */
float et_erff(float x);

#endif /* ET_MATH_H */
