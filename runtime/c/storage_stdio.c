/*
 * storage_stdio.c - the raw file I/O of the page store through C stdio (see storage.h): linked with
 * storage_file.c, which does the rest. Used by the host build of generated firmware and by the tests.
 * (On a Cortex-M, newlib's stdio would work too through rdimon semihosting, but it allocates its FILE
 * objects and buffers on the heap, outside the planned arena; storage_semihost.c talks to the debugger
 * directly instead.)
 */
#include <stdio.h>

#include "storage.h"

int et_file_write(const char *path, const unsigned char header[ET_BLOCK_HEADER_BYTES], const void *src,
                  uint32_t bytes)
{
    FILE *f = fopen(path, "wb");
    int ok;

    if (f == NULL)
        return ET_ERR_IO;
    ok = fwrite(header, 1u, ET_BLOCK_HEADER_BYTES, f) == ET_BLOCK_HEADER_BYTES;
    if (ok && bytes > 0u)
        ok = fwrite(src, 1u, bytes, f) == bytes;
    if (fclose(f) != 0) /* fclose flushes: a full disk may only show up here */
        ok = 0;
    return ok ? ET_OK : ET_ERR_IO;
}

int et_file_read(const char *path, unsigned char header[ET_BLOCK_HEADER_BYTES], void *dst, uint32_t bytes)
{
    FILE *f = fopen(path, "rb");
    int rc = ET_OK;

    if (f == NULL)
        return ET_ERR_NOT_FOUND;
    if (fread(header, 1u, ET_BLOCK_HEADER_BYTES, f) != ET_BLOCK_HEADER_BYTES)
        rc = ferror(f) ? ET_ERR_IO : ET_ERR_FORMAT;            /* shorter than a header: truncated */
    else if (bytes > 0u && fread(dst, 1u, bytes, f) != bytes)
        rc = ferror(f) ? ET_ERR_IO : ET_ERR_FORMAT;            /* fewer bytes than asked: wrong size */
    else if (fgetc(f) != EOF)
        rc = ET_ERR_FORMAT;                                    /* more bytes than asked: wrong size */
    if (fclose(f) != 0 && rc == ET_OK)
        rc = ET_ERR_IO;
    return rc;
}
