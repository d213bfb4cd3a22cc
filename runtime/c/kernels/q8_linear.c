/* q8_linear.c - see q8_linear.h. */
#include "q8_linear.h"

#include <stddef.h>

void et_q8_linear_forward_ref(int n, int in, int out, const int8_t *x, int32_t x_zp, const int8_t *w,
                              const int32_t *bias, const et_q8_requant *q, int8_t *y)
{
    int i, o, k;

    for (i = 0; i < n; ++i)
        for (o = 0; o < out; ++o) {
            int32_t acc = bias != NULL ? bias[o] : 0;
            for (k = 0; k < in; ++k)
                acc += (x[(long)i * in + k] - x_zp) * w[(long)o * in + k];
            y[(long)i * out + o] = et_q8_output(q, o, acc);
        }
}

void et_q8_linear_backward_input_ref(int n, int in, int out, const int8_t *gy, const int8_t *w,
                                     const et_q8_requant *q, int8_t *gx)
{
    int i, o, k;

    for (i = 0; i < n; ++i)
        for (k = 0; k < in; ++k) {
            int32_t acc = 0;
            for (o = 0; o < out; ++o)
                acc += gy[(long)i * out + o] * w[(long)o * in + k];
            gx[(long)i * in + k] = et_q8_output(q, k, acc);
        }
}

void et_q8_linear_backward_weight_ref(int n, int in, int out, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                      int32_t *gw, int32_t *gb)
{
    int i, o, k;

    for (o = 0; o < out; ++o) {
        for (k = 0; k < in; ++k) {
            int32_t acc = 0;
            for (i = 0; i < n; ++i)
                acc += gy[(long)i * out + o] * (x[(long)i * in + k] - x_zp);
            gw[(long)o * in + k] = acc;
        }
        if (gb != NULL) {
            int32_t acc = 0;
            for (i = 0; i < n; ++i)
                acc += gy[(long)i * out + o];
            gb[o] = acc;
        }
    }
}

#if ET_Q8_FAST
/* Four outputs at a time: one input row against four weight rows (et_q8_dot4_rows). */
void et_q8_linear_forward(int n, int in, int out, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int8_t *y)
{
    int i, o, j;

    for (i = 0; i < n; ++i) {
        const int8_t *xr = x + (long)i * in;
        int8_t *yr = y + (long)i * out;
        for (o = 0; o + 4 <= out; o += 4) {
            const int8_t *w0 = w + (long)o * in;
            int32_t acc[4];
            for (j = 0; j < 4; ++j)
                acc[j] = bias != NULL ? bias[o + j] : 0;
            et_q8_dot4_rows(xr, -x_zp, w0, w0 + in, w0 + 2 * in, w0 + 3 * in, in, acc);
            for (j = 0; j < 4; ++j)
                yr[o + j] = et_q8_output(q, o + j, acc[j]);
        }
        for (; o < out; ++o)
            yr[o] = et_q8_output(q, o, et_q8_dot(xr, -x_zp, w + (long)o * in, in, bias != NULL ? bias[o] : 0));
    }
}

/* Four input features at a time: a sum down four adjacent columns of W (et_q8_colsum4). */
void et_q8_linear_backward_input(int n, int in, int out, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int8_t *gx)
{
    int i, k, o, j;

    for (i = 0; i < n; ++i) {
        const int8_t *gr = gy + (long)i * out;
        int8_t *gxr = gx + (long)i * in;
        for (k = 0; k + 4 <= in; k += 4) {
            int32_t acc[4] = {0, 0, 0, 0};
            et_q8_colsum4(gr, w + k, in, out, acc);
            for (j = 0; j < 4; ++j)
                gxr[k + j] = et_q8_output(q, k + j, acc[j]);
        }
        for (; k < in; ++k) {
            int32_t acc = 0;
            for (o = 0; o < out; ++o)
                acc += gr[o] * w[(long)o * in + k];
            gxr[k] = et_q8_output(q, k, acc);
        }
    }
}
/* Row o of gw, one sample after the other (the first stored, the rest added), four features per step: SXTAB16
 * unpacks x - x_zp (features k and k+2; of the rotated word k+1 and k+3) and each half is multiplied by the sample's
 * gradient (SMULBB / SMULTB, SMLABB / SMLATB where added): no index arithmetic and no zero point per element. */
void et_q8_linear_backward_weight(int n, int in, int out, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int32_t *gw, int32_t *gb)
{
    const uint32_t off = et_q8_dup16(-x_zp);
    int i, o, k;

    for (o = 0; o < out; ++o) {
        int32_t *gr = gw + (long)o * in;
        int32_t sum = 0;
        for (i = 0; i < n; ++i) {
            const int32_t g = gy[(long)i * out + o];
            const int8_t *xr = x + (long)i * in;
            sum += g;
            if (i == 0)
                for (k = 0; k + 4 <= in; k += 4) {
                    const uint32_t v = et_q8_load4(xr + k);
                    const uint32_t e = et_q8_sxtab16(off, v), d = et_q8_sxtab16_ror8(off, v);
                    gr[k] = et_q8_lo(e) * g;
                    gr[k + 1] = et_q8_lo(d) * g;
                    gr[k + 2] = et_q8_hi(e) * g;
                    gr[k + 3] = et_q8_hi(d) * g;
                }
            else
                for (k = 0; k + 4 <= in; k += 4) {
                    const uint32_t v = et_q8_load4(xr + k);
                    const uint32_t e = et_q8_sxtab16(off, v), d = et_q8_sxtab16_ror8(off, v);
                    gr[k] += et_q8_lo(e) * g;
                    gr[k + 1] += et_q8_lo(d) * g;
                    gr[k + 2] += et_q8_hi(e) * g;
                    gr[k + 3] += et_q8_hi(d) * g;
                }
            for (k = in & ~3; k < in; ++k)
                gr[k] = (i == 0 ? 0 : gr[k]) + (xr[k] - x_zp) * g;
        }
        if (n == 0)
            for (k = 0; k < in; ++k)
                gr[k] = 0;
        if (gb != NULL)
            gb[o] = sum;
    }
}
#else
void et_q8_linear_forward(int n, int in, int out, const int8_t *x, int32_t x_zp, const int8_t *w,
                          const int32_t *bias, const et_q8_requant *q, int8_t *y)
{
    et_q8_linear_forward_ref(n, in, out, x, x_zp, w, bias, q, y);
}

void et_q8_linear_backward_input(int n, int in, int out, const int8_t *gy, const int8_t *w,
                                 const et_q8_requant *q, int8_t *gx)
{
    et_q8_linear_backward_input_ref(n, in, out, gy, w, q, gx);
}

void et_q8_linear_backward_weight(int n, int in, int out, const int8_t *gy, const int8_t *x, int32_t x_zp,
                                  int32_t *gw, int32_t *gb)
{
    et_q8_linear_backward_weight_ref(n, in, out, gy, x, x_zp, gw, gb);
}
#endif
