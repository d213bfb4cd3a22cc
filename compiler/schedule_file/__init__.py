"""Stage 4, the schedule file: the versioned, checksummed JSON contract between the compiler and codegen."""
