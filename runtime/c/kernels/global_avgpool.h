/*
 * global_avgpool.h - global average pooling, x [n][c][h][w] -> y [n][c] (also read as [n][c][1][1]):
 * torch.nn.AdaptiveAvgPool2d(1), which torch computes as x.mean((-2, -1)), i.e. a sum divided by h*w.
 * hw = h * w. Backward: every input element of a plane gets gy / hw (mean's backward).
 */
#ifndef ET_GLOBAL_AVGPOOL_H
#define ET_GLOBAL_AVGPOOL_H

void et_global_avgpool_forward(int n, int c, int hw, const float *x, float *y);
void et_global_avgpool_backward(int n, int c, int hw, const float *gy, float *gx);

#endif /* ET_GLOBAL_AVGPOOL_H */
