/*
 * cross_entropy.h - softmax cross-entropy, mean over the batch: F.cross_entropy(logits, labels) with its
 * defaults (no class weights, ignore_index -100, reduction "mean", no label smoothing).
 *
 * logits [n][classes] float32, labels [n] int32 in 0..classes-1, or ET_IGNORE_INDEX for a sample that
 * does not count (it gets a zero gradient and the mean is over the others; if all are ignored the loss
 * is NaN, as in torch). Labels outside that range are the caller's bug and are not checked here.
 *
 * Backward needs no saved softmax: it recomputes log_softmax from the logits (the registry saves the
 * logits and labels) and writes dL/dlogits for a loss gradient of 1.
 */
#ifndef ET_CROSS_ENTROPY_H
#define ET_CROSS_ENTROPY_H

#include <stdint.h>

#define ET_IGNORE_INDEX (-100)

float et_cross_entropy_forward(int n, int classes, const float *logits, const int32_t *labels);
void et_cross_entropy_backward(int n, int classes, const float *logits, const int32_t *labels,
                               float *grad_logits);

#endif /* ET_CROSS_ENTROPY_H */
