/*
 * nll_loss.h - negative log-likelihood over a batch, mean reduction, no class weights:
 * aten.nll_loss_forward(self, target, weight=None, reduction=Mean, ignore_index) -> (loss, total_weight)
 * and aten.nll_loss_backward(grad_output, self, target, weight=None, reduction=Mean, ignore_index,
 * total_weight). After log_softmax.h it is F.cross_entropy.
 *
 * logp [n][classes] float32 log-probabilities; target [n] int32 in 0..classes-1, or ignore_index for a
 * sample that does not count. total_weight is the number of counted samples (as a float, like torch);
 * if none counts the loss is NaN, as in torch. Targets outside that range are the caller's bug.
 *
 *   forward:  loss = -(sum of logp[i][target[i]]) / total_weight, the sum in torch's cascade order
 *   backward: gx[i][target[i]] = -(gy / total_weight), 0 elsewhere (and on ignored rows)
 * The backward does not read logp: the gradient depends on the targets alone.
 */
#ifndef ET_NLL_LOSS_H
#define ET_NLL_LOSS_H

#include <stdint.h>

void et_nll_loss_forward(int n, int classes, const float *logp, const int32_t *target, int ignore_index,
                         float *loss, float *total_weight);
void et_nll_loss_backward(int n, int classes, const float *gy, const int32_t *target, int ignore_index,
                          const float *total_weight, float *gx);

#endif /* ET_NLL_LOSS_H */
