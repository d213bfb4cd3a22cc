/*
 * flatten.h - torch.flatten(x, 1): [n][c][h][w] -> [n][c*h*w].
 *
 * On contiguous NCHW data this is a no-op: the bytes of x already are the flattened tensor, row-major
 * [n][c*h*w], and its gradient is likewise the unflattened gradient. The code generator therefore gives
 * the output the input's arena offset and emits no call. et_flatten_copy exists for the case where the
 * planner placed them apart: a plain copy, usable for forward and backward alike (a no-op if y == x).
 */
#ifndef ET_FLATTEN_H
#define ET_FLATTEN_H

void et_flatten_copy(int count, const float *x, float *y);

#endif /* ET_FLATTEN_H */
