/* q8_conv2d_input_grad_sums.c - see q8_conv2d_input_grad_sums.h. */
#include "q8_conv2d_input_grad_sums.h"

void et_q8_conv2d_backward_input_sums(const et_conv2d_shape *s, const int8_t *gy, const int8_t *w, int32_t *acc)
{
    int n, ic, ih, iw;

    for (n = 0; n < s->n; ++n)
        for (ic = 0; ic < s->c_in; ++ic)
            for (ih = 0; ih < s->h_in; ++ih)
                for (iw = 0; iw < s->w_in; ++iw)
                    acc[(((long)n * s->c_in + ic) * s->h_in + ih) * s->w_in + iw] =
                        et_q8_input_grad_sum(s, gy, w, n, ic, ih, iw);
}
