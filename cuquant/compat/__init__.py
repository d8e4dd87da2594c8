"""Entry points shaped like the seed libraries', so that their users change an import and
not their code: `cuquant.compat.tileops` (op objects) and `cuquant.compat.deepspeed`
(the quantizer binding's functions)."""
