"""C code generation for runtime/c: a schedule becomes training firmware (plan.c/plan.h, drivers, Makefile)."""

from .firmware import FIRMWARE_FILES, ArenaOverflowError, CodegenError, render_c_firmware
from .names import Namer, c_comment, c_ident

__all__ = ["FIRMWARE_FILES", "ArenaOverflowError", "CodegenError", "Namer", "c_comment", "c_ident", "render_c_firmware"]
