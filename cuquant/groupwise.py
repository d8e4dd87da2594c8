"""Group-wise integer quantization in DeepSpeed's format (SPEC section 5). Not built yet."""


def specializations():
    return iter(())
