/*
 * global_avgpool.h - global average pooling, x [n][c][h][w] -> y [n][c] (also read as [n][c][1][1]):
 * torch.nn.AdaptiveAvgPool2d(1), which torch computes as x.mean((-2, -1)), i.e. a sum divided by h*w.
 * hw = h * w. Backward: every input element of a plane gets gy / hw (mean's backward).
 *
 * ATen ops (the joint graph's spelling), with hw = h * w:
 *   aten.mean.dim(x, [-1, -2] or [2, 3] or [-2, -1] or [3, 2], keepdim True or False)
 *       -> et_global_avgpool_forward(n, c, hw, x, y)     (keepdim only changes y's shape, not its bytes)
 *   its backward, aten.div.Scalar(aten.expand(gy, [n, c, h, w]), hw) (after aten.unsqueeze twice when
 *   keepdim=False)  -> et_global_avgpool_backward(n, c, hw, gy, gx)
 * The backward is bit-identical to torch (both divide by hw; neither multiplies by 1/hw). The forward
 * divides the sum by hw as torch's mean does, but its sum is sequential where torch's sum kernel uses
 * vector accumulators (even for short rows), so it agrees with aten.mean.dim to float32 rounding.
 */
#ifndef ET_GLOBAL_AVGPOOL_H
#define ET_GLOBAL_AVGPOOL_H

void et_global_avgpool_forward(int n, int c, int hw, const float *x, float *y);
void et_global_avgpool_backward(int n, int c, int hw, const float *gy, float *gx);

#endif /* ET_GLOBAL_AVGPOOL_H */
