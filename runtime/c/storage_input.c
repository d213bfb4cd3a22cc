/* storage_input.c - see storage_input.h. */
#include <stddef.h>
#include <string.h>

#include "storage_input.h"

static uint32_t g_bytes_read;

int et_input_read(const et_input_reader *in, uint32_t offset, uint32_t count, float *dst)
{
    int rc;

    if (in == NULL || in->read == NULL || (dst == NULL && count > 0u))
        return ET_ERR_ARG;
    if (count == 0u)
        return ET_OK;
    rc = in->read(in->ctx, offset, count, dst);
    if (rc == ET_OK)
        g_bytes_read += 4u * count;
    return rc;
}

uint32_t et_input_bytes_read(void)
{
    return g_bytes_read;
}

void et_input_reset_counter(void)
{
    g_bytes_read = 0u;
}

static int read_memory(void *ctx, uint32_t offset, uint32_t count, float *dst)
{
    memcpy(dst, (const float *)ctx + offset, 4u * count);
    return ET_OK;
}

et_input_reader et_input_memory(const float *x)
{
    et_input_reader r;
    r.read = read_memory;
    r.ctx = (void *)(uintptr_t)x; /* read only: read_memory never writes through it */
    return r;
}
