"""Calls' arguments as the arguments of a jitted function: the arrays in a list, the rest a
structure holding their places (so the arrays are traced, not constants of the function)."""

import jax


def flat(v, arrays):
    """v with its JAX arrays appended to `arrays` and replaced by their places there."""
    if isinstance(v, jax.Array):
        arrays.append(v)
        return ("__array__", len(arrays) - 1)
    if isinstance(v, (list, tuple)):
        return type(v)(flat(e, arrays) for e in v)
    if isinstance(v, dict):
        return {k: flat(e, arrays) for k, e in v.items()}
    return v


def unflat(v, arrays):
    """`flat` undone, with `arrays` (the traced ones) in the places."""
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "__array__":
        return arrays[v[1]]
    if isinstance(v, (list, tuple)):
        return type(v)(unflat(e, arrays) for e in v)
    if isinstance(v, dict):
        return {k: unflat(e, arrays) for k, e in v.items()}
    return v
