/*
 * maxpool2d.h - 2-D max-pooling with argmax (torch.nn.MaxPool2d / max_pool2d_with_indices), NCHW.
 *
 * Shapes and window: pool2d.h. The argmax idx [n][c][h_out][w_out] (int32) is the flat index ih*w_in + iw
 * of the chosen element inside its own input plane - torch's `return_indices` convention. The first
 * maximum in row-major window order wins a tie, and a NaN wins over numbers, exactly as PyTorch's CPU
 * kernel; so a recompute gives the same indices as the first forward and as torch.
 *
 * The op registry splits max-pool so that backward keeps only idx:
 *   et_maxpool2d_forward   values and argmax (either may be NULL when only the other is wanted)
 *   et_maxpool2d_gather    values from x and a saved idx (a recompute without searching)
 *   et_maxpool2d_backward  gx = scatter-add of gy at idx into a zeroed gx
 */
#ifndef ET_MAXPOOL2D_H
#define ET_MAXPOOL2D_H

#include <stdint.h>

#include "pool2d.h"

/* ET_OK if the shape is consistent (positive sizes, pad <= half the dilated kernel as torch requires). */
int et_maxpool2d_shape_check(const et_pool2d_shape *s);

void et_maxpool2d_forward(const et_pool2d_shape *s, const float *x, float *y, int32_t *idx);
void et_maxpool2d_gather(const et_pool2d_shape *s, const float *x, const int32_t *idx, float *y);
/* Overwrites all of gx (zeroes it, then adds each gy at its argmax, in output order). */
void et_maxpool2d_backward(const et_pool2d_shape *s, const float *gy, const int32_t *idx, float *gx);

#endif /* ET_MAXPOOL2D_H */
