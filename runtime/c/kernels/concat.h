/*
 * concat.h - concatenation along channels (torch.cat(dim=1)) of NCHW tensors, one input at a time.
 *
 * The output y has c_total channels; an input x of c_part channels goes to channels
 * c_offset .. c_offset + c_part - 1. hw = h * w (all inputs share n, h, w). The code generator calls
 * et_concat_forward_part once per input, with increasing offsets.
 *
 * Backward: the gradient of each input is its channel slice of gy (the registry's grad_views "narrow").
 * With n == 1 the slice is contiguous, gy + c_offset*hw, and needs no copy at all; with a batch it is
 * strided and et_concat_backward_part copies it out.
 */
#ifndef ET_CONCAT_H
#define ET_CONCAT_H

void et_concat_forward_part(int n, int hw, int c_total, int c_offset, int c_part, const float *x, float *y);
void et_concat_backward_part(int n, int hw, int c_total, int c_offset, int c_part, const float *gy, float *gx);

#endif /* ET_CONCAT_H */
