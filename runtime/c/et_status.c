/* et_status.c - names of the status codes (see et_status.h). */
#include "et_status.h"

const char *et_status_str(int status)
{
    switch (status) {
    case ET_OK: return "ET_OK";
    case ET_ERR_ARG: return "ET_ERR_ARG";
    case ET_ERR_IO: return "ET_ERR_IO";
    case ET_ERR_NOT_FOUND: return "ET_ERR_NOT_FOUND";
    case ET_ERR_CRC: return "ET_ERR_CRC";
    case ET_ERR_FORMAT: return "ET_ERR_FORMAT";
    case ET_ERR_NOT_INIT: return "ET_ERR_NOT_INIT";
    default: return "ET_ERR_UNKNOWN";
    }
}
