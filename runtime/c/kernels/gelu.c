/* gelu.c - see gelu.h. Constants are torch's double expressions rounded to float, as its kernel does. */
#include "gelu.h"

#include "../et_math.h"

#define SQRT1_2 0.707106781186547524f      /* M_SQRT1_2 */
#define INV_SQRT_2PI 0.398942280401432678f /* M_2_SQRTPI * M_SQRT1_2 * 0.5 */
#define SQRT_2_PI 0.797884560802865356f    /* M_SQRT2 * M_2_SQRTPI * 0.5 */
#define KAPPA 0.044715f

void et_gelu_forward(int count, const float *x, int approximate_tanh, float *y)
{
    int i;

    if (approximate_tanh) {
        for (i = 0; i < count; ++i) {
            const float v = x[i];
            const float inner = SQRT_2_PI * (v + KAPPA * (v * v * v));
            y[i] = 0.5f * v * (1.0f + et_tanhf(inner));
        }
    } else {
        for (i = 0; i < count; ++i) {
            const float v = x[i];
            y[i] = v * 0.5f * (1.0f + et_erff(v * SQRT1_2));
        }
    }
}

void et_gelu_backward(int count, const float *gy, const float *x, int approximate_tanh, float *gx)
{
    int i;

    if (approximate_tanh) {
        for (i = 0; i < count; ++i) {
            const float v = x[i];
            const float v2 = v * v;
            const float t = et_tanhf(SQRT_2_PI * (v + KAPPA * (v2 * v)));
            const float left_derivative = 0.5f * (1.0f + t);
            const float inner_derivative = SQRT_2_PI * (1.0f + 3.0f * KAPPA * v2);
            const float right_derivative = 0.5f * v * (1.0f - t * t) * inner_derivative;
            gx[i] = gy[i] * (left_derivative + right_derivative);
        }
    } else {
        for (i = 0; i < count; ++i) {
            const float v = x[i];
            const float cdf = 0.5f * (1.0f + et_erff(v * SQRT1_2));
            const float pdf = INV_SQRT_2PI * et_expf(v * v * -0.5f);
            gx[i] = gy[i] * (cdf + v * pdf);
        }
    }
}
