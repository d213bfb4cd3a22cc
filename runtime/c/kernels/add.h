/*
 * add.h - residual add, y = a + b, on `count` contiguous floats; and add-into, acc += g, which sums the
 * gradient contributions of a tensor used more than once (the registry's grad_sum: left to right).
 *
 * Add has no backward kernel: both inputs' gradients ARE the output gradient (the registry's grad_views),
 * so the code generator passes the same buffer on. Aliasing y with a or b is allowed.
 */
#ifndef ET_ADD_H
#define ET_ADD_H

void et_add_forward(int count, const float *a, const float *b, float *y);
void et_add_into(int count, float *acc, const float *g);

#endif /* ET_ADD_H */
