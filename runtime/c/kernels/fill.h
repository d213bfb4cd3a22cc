/*
 * fill.h - aten.fill.Scalar, y = v everywhere, on `count` floats; with aten.empty_like (which makes nothing
 * to compute) it is how torch's joint graph writes a tensor of ones (SiLU's backward, the loss's seed).
 */
#ifndef ET_FILL_H
#define ET_FILL_H

void et_fill(int count, float v, float *y);

#endif /* ET_FILL_H */
