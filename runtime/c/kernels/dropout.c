/* dropout.c - see dropout.h. */
#include "dropout.h"

static uint32_t fmix(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

uint32_t et_dropout_stream(uint32_t seed, uint32_t step, uint32_t key)
{
    return fmix(fmix(fmix(seed) ^ step) ^ key);
}

int et_dropout_keep(uint32_t stream, uint32_t i, uint32_t threshold)
{
    return (fmix(stream ^ (i * 0x9E3779B9u)) >> 8) >= threshold;
}

void et_dropout_forward(int count, const float *x, uint32_t stream, uint32_t threshold, float scale, float *y)
{
    int i;

    for (i = 0; i < count; ++i) {
        const float m = et_dropout_keep(stream, (uint32_t)i, threshold) ? 1.0f : 0.0f;
        y[i] = x[i] * m * scale;
    }
}

void et_dropout_backward(int count, const float *gy, uint32_t stream, uint32_t threshold, float scale, float *gx)
{
    int i;

    for (i = 0; i < count; ++i) {
        const float m = et_dropout_keep(stream, (uint32_t)i, threshold) ? 1.0f : 0.0f;
        gx[i] = gy[i] * m * scale;
    }
}
