/*
 * sgd.h - SGD with momentum and weight decay, exactly as torch.optim.SGD (dampening 0, no Nesterov,
 * not maximizing), element by element:
 *     d   = g + weight_decay * p          (skipped when weight_decay == 0)
 *     buf = momentum * buf + d            (skipped when momentum == 0; buf starts at 0)
 *     p   = p - lr * buf                  (or p - lr * d without momentum)
 * torch creates the buffer as clone(d) at the first step; a buffer that starts at zero gives
 * 0 * momentum + d = d, the same value, so the caller only zeroes the momentum buffers once at init.
 */
#ifndef ET_SGD_H
#define ET_SGD_H

typedef struct et_sgd_params {
    float lr;
    float momentum;      /* 0: no momentum buffer is read or written (it may be NULL) */
    float weight_decay;
} et_sgd_params;

/* Update one parameter element *p with its gradient g; buf: its momentum element (NULL if momentum == 0). */
void et_sgd_update(const et_sgd_params *opt, float *p, float g, float *buf);

/* Update count parameters p[i] with gradients g[i] and momentum buffer buf[i] (NULL if momentum == 0). */
void et_sgd_step(const et_sgd_params *opt, int count, float *p, const float *g, float *buf);

#endif /* ET_SGD_H */
