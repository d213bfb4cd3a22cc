/*
 * storage_stdio.c - the page store on host files through C stdio (see storage.h).
 *
 * One file per page id, "<dir>/et_page_<id in hex>.bin", holding the block format of storage.h. Used by
 * the host build of generated firmware and by the tests. (On a Cortex-M, newlib's stdio would work too
 * through rdimon semihosting, but it allocates its FILE objects and buffers on the heap, outside the
 * planned arena; storage_semihost.c talks to the debugger directly instead.)
 */
#include <stdio.h>
#include <string.h>

#include "storage.h"

static char g_dir[ET_STORAGE_DIR_MAX + 1u];
static int g_ready;
static uint32_t g_bytes_out, g_bytes_in;

int et_storage_init(const char *dir)
{
    size_t len;

    if (dir == NULL)
        return ET_ERR_ARG;
    len = strlen(dir);
    if (len > ET_STORAGE_DIR_MAX)
        return ET_ERR_ARG;
    memcpy(g_dir, dir, len + 1u);
    g_ready = 1;
    g_bytes_out = 0u;
    g_bytes_in = 0u;
    return ET_OK;
}

void et_storage_counters(uint32_t *bytes_out, uint32_t *bytes_in)
{
    if (bytes_out != NULL)
        *bytes_out = g_bytes_out;
    if (bytes_in != NULL)
        *bytes_in = g_bytes_in;
}

int et_page_out(uint32_t id, const void *src, uint32_t bytes)
{
    char path[ET_STORAGE_DIR_MAX + ET_BLOCK_NAME_BYTES + 2u];
    unsigned char header[ET_BLOCK_HEADER_BYTES];
    FILE *f;
    int ok;

    if (!g_ready)
        return ET_ERR_NOT_INIT;
    if (src == NULL && bytes > 0u)
        return ET_ERR_ARG;
    if (et_block_file_name(path, sizeof path, g_dir, id) != ET_OK)
        return ET_ERR_ARG;
    et_block_header(header, id, src, bytes);

    f = fopen(path, "wb");
    if (f == NULL)
        return ET_ERR_IO;
    ok = fwrite(header, 1u, ET_BLOCK_HEADER_BYTES, f) == ET_BLOCK_HEADER_BYTES;
    if (ok && bytes > 0u)
        ok = fwrite(src, 1u, bytes, f) == bytes;
    if (fclose(f) != 0) /* fclose flushes: a full disk may only show up here */
        ok = 0;
    if (!ok)
        return ET_ERR_IO;
    g_bytes_out += bytes;
    return ET_OK;
}

int et_page_in(uint32_t id, void *dst, uint32_t bytes)
{
    char path[ET_STORAGE_DIR_MAX + ET_BLOCK_NAME_BYTES + 2u];
    unsigned char header[ET_BLOCK_HEADER_BYTES];
    FILE *f;
    int rc = ET_OK;

    if (!g_ready)
        return ET_ERR_NOT_INIT;
    if (dst == NULL && bytes > 0u)
        return ET_ERR_ARG;
    if (et_block_file_name(path, sizeof path, g_dir, id) != ET_OK)
        return ET_ERR_ARG;

    f = fopen(path, "rb");
    if (f == NULL)
        return ET_ERR_NOT_FOUND;
    /* Read straight into dst (no bounce buffer: RAM is the scarce thing); verified before returning OK. */
    if (fread(header, 1u, ET_BLOCK_HEADER_BYTES, f) != ET_BLOCK_HEADER_BYTES)
        rc = ferror(f) ? ET_ERR_IO : ET_ERR_FORMAT;            /* shorter than a header: truncated */
    else if (bytes > 0u && fread(dst, 1u, bytes, f) != bytes)
        rc = ferror(f) ? ET_ERR_IO : ET_ERR_FORMAT;            /* fewer bytes than asked: wrong size */
    else if (fgetc(f) != EOF)
        rc = ET_ERR_FORMAT;                                    /* more bytes than asked: wrong size */
    if (fclose(f) != 0 && rc == ET_OK)
        rc = ET_ERR_IO;
    if (rc == ET_OK)
        rc = et_block_check(header, id, dst, bytes);
    if (rc == ET_OK)
        g_bytes_in += bytes;
    return rc;
}
