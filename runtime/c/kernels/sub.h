/*
 * sub.h - aten.sub.Tensor of same-shape tensors with alpha 1, y = a - b, on `count` contiguous floats
 * (torch's joint graph spells SiLU's backward with it). Aliasing y with an input is allowed.
 */
#ifndef ET_SUB_H
#define ET_SUB_H

void et_sub_forward(int count, const float *a, const float *b, float *y);

#endif /* ET_SUB_H */
