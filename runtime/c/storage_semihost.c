/*
 * storage_semihost.c - the raw file I/O of the page store through ARM semihosting (see storage.h):
 * linked with storage_file.c, which does the rest.
 *
 * Under `qemu-system-arm -semihosting-config enable=on,target=native` (or a debug probe with semihosting
 * enabled) these calls open, read and write files on the host, relative to the emulator's working
 * directory: the page store is a host folder, and the files are byte-identical to storage_stdio.c's, so
 * either build can read the other's pages. The calls go straight to the debugger (BKPT 0xAB on
 * M-profile cores) instead of through newlib's fopen/fwrite: newlib would malloc a FILE and a buffer per
 * open file, memory outside the arena the plan accounts for.
 *
 * Compiled for anything but an M-profile ARM core, every semihosting call fails, so every page operation
 * returns ET_ERR_IO / ET_ERR_NOT_FOUND (this keeps the file warning-clean on the host compiler).
 */
#include <stdint.h>
#include <string.h>

#include "storage.h"

/* Semihosting operation numbers (ARM "Semihosting for AArch32 and AArch64", v2). */
#define SYS_OPEN  0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE 0x05
#define SYS_READ  0x06
#define SYS_FLEN  0x0C
/* SYS_OPEN modes: indices into the fopen mode strings "r","rb","r+","r+b","w","wb",... */
#define OPEN_RB 1
#define OPEN_WB 5

/* One semihosting request: r0 = operation, r1 = address of its argument block; the answer comes in r0. */
static int semihost(int op, uintptr_t *args)
{
#if defined(__arm__) && defined(__ARM_ARCH_PROFILE) && (__ARM_ARCH_PROFILE == 'M')
    register int r0 __asm__("r0") = op;
    register uintptr_t *r1 __asm__("r1") = args;
    /* "memory": the host reads and writes the buffers the argument block points to. */
    __asm__ __volatile__("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
#else
    (void)op;
    (void)args;
    return -1;
#endif
}

static int sh_open(const char *path, int mode)
{
    uintptr_t a[3];
    a[0] = (uintptr_t)path;
    a[1] = (uintptr_t)mode;
    a[2] = (uintptr_t)strlen(path);
    return semihost(SYS_OPEN, a);
}

static int sh_close(int handle)
{
    uintptr_t a[1];
    a[0] = (uintptr_t)handle;
    return semihost(SYS_CLOSE, a);
}

/* SYS_WRITE and SYS_READ return the number of bytes NOT transferred: 0 means all of them. */
static int sh_write(int handle, const void *buf, uint32_t len)
{
    uintptr_t a[3];
    a[0] = (uintptr_t)handle;
    a[1] = (uintptr_t)buf;
    a[2] = (uintptr_t)len;
    return semihost(SYS_WRITE, a) == 0;
}

static int sh_read(int handle, void *buf, uint32_t len)
{
    uintptr_t a[3];
    a[0] = (uintptr_t)handle;
    a[1] = (uintptr_t)buf;
    a[2] = (uintptr_t)len;
    return semihost(SYS_READ, a) == 0;
}

static int sh_flen(int handle)
{
    uintptr_t a[1];
    a[0] = (uintptr_t)handle;
    return semihost(SYS_FLEN, a);
}

int et_file_write(const char *path, const unsigned char header[ET_BLOCK_HEADER_BYTES], const void *src,
                  uint32_t bytes)
{
    const int h = sh_open(path, OPEN_WB);
    int ok;

    if (h == -1)
        return ET_ERR_IO;
    ok = sh_write(h, header, ET_BLOCK_HEADER_BYTES);
    if (ok && bytes > 0u)
        ok = sh_write(h, src, bytes);
    if (sh_close(h) != 0)
        ok = 0;
    return ok ? ET_OK : ET_ERR_IO;
}

int et_file_read(const char *path, unsigned char header[ET_BLOCK_HEADER_BYTES], void *dst, uint32_t bytes)
{
    const int h = sh_open(path, OPEN_RB);
    int len, rc = ET_OK;

    if (h == -1)
        return ET_ERR_NOT_FOUND;
    len = sh_flen(h);
    if (len == -1)
        rc = ET_ERR_IO;
    else if ((uint32_t)len != ET_BLOCK_HEADER_BYTES + bytes)
        rc = ET_ERR_FORMAT; /* truncated, or a block of another size */
    else if (!sh_read(h, header, ET_BLOCK_HEADER_BYTES) || (bytes > 0u && !sh_read(h, dst, bytes)))
        rc = ET_ERR_IO;
    if (sh_close(h) != 0 && rc == ET_OK)
        rc = ET_ERR_IO;
    return rc;
}
