/*
 * sum.h - the sum over each H x W plane of an NCHW tensor: aten.sum.dim_IntList(self, [2, 3] (or [-2, -1]),
 * keepdim) for x [n][c][h][w] -> y [n][c] (read as [n][c][1][1] with keepdim). In a training graph it is the
 * gradient of a per-channel scale (squeeze-excitation's gate: the sum of gy * x over each plane).
 *
 * planes = n * c, hw = h * w. A float accumulator, in index order: agrees with torch to float32 rounding
 * (torch sums in a vectorized order).
 */
#ifndef ET_SUM_H
#define ET_SUM_H

void et_sum_planes(int planes, int hw, const float *x, float *y);

#endif /* ET_SUM_H */
