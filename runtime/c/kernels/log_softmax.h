/*
 * log_softmax.h - log-softmax over the classes of [n][classes] float32 scores, and its backward:
 * aten._log_softmax(self, dim=1, half_to_float=False) and aten._log_softmax_backward_data(grad_output,
 * output, dim=1, input_dtype=float32). With nll_loss.h it is F.cross_entropy, as torch's joint graph
 * splits it.
 *
 *   forward:  y[j] = (x[j] - max) - log(sum_k exp(x[k] - max))   per row
 *   backward: gx[j] = gy[j] - exp(y[j]) * sum_k gy[k]             per row (reads the forward's output y)
 * exp and log are et_expf / et_logf (et_math.h), so the host and the MCU agree bit for bit; torch uses its
 * vectorized exp/log, so results agree with torch to float32 rounding. Outputs never alias inputs.
 */
#ifndef ET_LOG_SOFTMAX_H
#define ET_LOG_SOFTMAX_H

void et_log_softmax_forward(int n, int classes, const float *x, float *y);
void et_log_softmax_backward(int n, int classes, const float *gy, const float *y, float *gx);

#endif /* ET_LOG_SOFTMAX_H */
