/*
 * storage_file.c - the page store on files, shared by storage_stdio.c and storage_semihost.c (see
 * storage.h).
 *
 * One file per page id, "<dir>/et_page_<id in hex>.bin", holding the block format of storage.h. This file
 * keeps the directory and the byte counters, checks the arguments, builds the header and verifies the CRC
 * at page-in; the back end linked with it (et_file_write / et_file_read) only moves the bytes: C stdio on
 * the host, semihosting calls on a Cortex-M. A board port that has no files links neither this file nor
 * a back end, and defines the four page-store functions itself (runtime/c/README.md).
 */
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

/* What page-out and page-in check first: the store is initialized, `buf` is there if bytes are to move,
 * and the file name fits in `path`. */
static int file_of(char path[ET_STORAGE_PATH_BYTES], uint32_t id, const void *buf, uint32_t bytes)
{
    if (!g_ready)
        return ET_ERR_NOT_INIT;
    if (buf == NULL && bytes > 0u)
        return ET_ERR_ARG;
    if (et_block_file_name(path, ET_STORAGE_PATH_BYTES, g_dir, id) != ET_OK)
        return ET_ERR_ARG;
    return ET_OK;
}

int et_page_out(uint32_t id, const void *src, uint32_t bytes)
{
    char path[ET_STORAGE_PATH_BYTES];
    unsigned char header[ET_BLOCK_HEADER_BYTES];
    int rc = file_of(path, id, src, bytes);

    if (rc != ET_OK)
        return rc;
    et_block_header(header, id, src, bytes);
    rc = et_file_write(path, header, src, bytes);
    if (rc == ET_OK)
        g_bytes_out += bytes;
    return rc;
}

int et_page_in(uint32_t id, void *dst, uint32_t bytes)
{
    char path[ET_STORAGE_PATH_BYTES];
    unsigned char header[ET_BLOCK_HEADER_BYTES];
    int rc = file_of(path, id, dst, bytes);

    if (rc != ET_OK)
        return rc;
    /* Read straight into dst (no bounce buffer: RAM is the scarce thing); verified before returning OK. */
    rc = et_file_read(path, header, dst, bytes);
    if (rc == ET_OK)
        rc = et_block_check(header, id, dst, bytes);
    if (rc == ET_OK)
        g_bytes_in += bytes;
    return rc;
}
