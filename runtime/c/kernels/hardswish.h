/*
 * hardswish.h - hard swish, y = x * min(max(x + 3, 0), 6) / 6, on `count` contiguous floats.
 *
 *   aten.hardswish(self) -> out                          et_hardswish_forward(count, self, out)
 *   aten.hardswish_backward(grad_output, self) -> gx     et_hardswish_backward(count, grad_output, self, gx)
 *
 * Forward evaluates (x * clamp(x + 3, 0, 6)) / 6 left to right, as torch does. Backward reads the forward
 * INPUT x:  gx = 0 for x <= -3,  gy for x >= 3,  gy * (x / 3 + 0.5) in between - torch's boundaries
 * (both its scalar and vector paths give 0 at exactly -3 and gy at exactly +3). Bit-identical to torch;
 * NaN propagates. In place is allowed.
 */
#ifndef ET_HARDSWISH_H
#define ET_HARDSWISH_H

void et_hardswish_forward(int count, const float *x, float *y);
void et_hardswish_backward(int count, const float *gy, const float *x, float *gx);

#endif /* ET_HARDSWISH_H */
