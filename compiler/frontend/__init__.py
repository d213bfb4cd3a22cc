"""Stage 1, the frontend: a model given as a zoo name, a file or a module, resolved and traced by torch."""
