/*
 * div.h - aten.div.Tensor on `count` contiguous floats: y = a / b of same-shape tensors (et_div_forward), or
 * y = x / v by a number (et_div_scalar; torch's graph spells `x / 2` so, and its backward `gy / 2`). A true
 * division, as torch's: not a multiply by the reciprocal, which rounds differently. Aliasing y with an input
 * is allowed.
 */
#ifndef ET_DIV_H
#define ET_DIV_H

void et_div_forward(int count, const float *a, const float *b, float *y);
void et_div_scalar(int count, const float *x, float v, float *y);

#endif /* ET_DIV_H */
