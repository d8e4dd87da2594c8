"""A model of quantize_groups_tiles' index arithmetic (cuda_src/groups.cuh), run without a
GPU: lane l of a warp holds units u0 + 32 k + l (k < K) of a tile; the last tile is moved
back to end with the units; reduce_steps' transposed butterfly leaves lane l the reduced
words of steps first, first + 1, ...; the lane prepares group (first + i) * GPS + l / UPG
unless it only duplicates another lane; a unit takes the Params at
(l / UPG) + k * GPS. Checks, for UPG and K from 1 to 32 and inputs of one tile to several
with a partial last one, that every reduced word holds exactly its group's units, that
each group of a tile is prepared by one lane, and that every unit of the input is encoded
with its own group's parameters.

    python benchmarks/results/2026-12-01-tiles-prepared/index_model.py
"""


def reduce_steps(UPG, K):
    """Each lane's reduced items (sets of units of a tile starting at 0), its `first`, and
    the mask of lanes that duplicate another's groups."""
    w = [[frozenset([32 * k + lane]) for k in range(K)] for lane in range(32)]
    first, n, duplicates = [0] * 32, K, 0
    o = UPG // 2
    while o > 0:
        new = [list(items) for items in w]
        for lane in range(32):
            partner = lane ^ o
            if n >= 2:
                h = n // 2
                upper, partner_upper = bool(lane & o), bool(partner & o)
                for i in range(h):
                    keep = w[lane][i + h] if upper else w[lane][i]
                    sent = w[partner][i] if partner_upper else w[partner][i + h]
                    new[lane][i] = keep | sent
                new[lane] = new[lane][:h]
                first[lane] += h if upper else 0
            else:
                new[lane][0] = w[lane][0] | w[partner][0]
        if n < 2:
            duplicates |= o
        n = max(1, n // 2)
        w, o = new, o // 2
    return w, first, duplicates


def check(UPG, K, n_units):
    GPS, tile = 32 // UPG, 32 * K
    w, first, duplicates = reduce_steps(UPG, K)
    assert duplicates == (UPG // K - 1 if K < UPG else 0)
    encoded = {}
    for t in range(-(-n_units // tile)):
        u0 = min(t * tile, n_units - tile)
        assert u0 % UPG == 0
        prepared = {}
        for lane in range(32):
            for i, items in enumerate(w[lane]):
                j = (first[lane] + i) * GPS + lane // UPG
                assert items == frozenset(range(j * UPG, (j + 1) * UPG)), (UPG, K, lane, i)
                if lane & duplicates == 0:
                    assert j not in prepared
                    prepared[j] = u0 // UPG + j
        assert sorted(prepared) == list(range(K * GPS))
        for k in range(K):
            for lane in range(32):
                u = u0 + 32 * k + lane
                encoded.setdefault(u, set()).add(prepared[lane // UPG + k * GPS])
    assert sorted(encoded) == list(range(n_units))
    assert all(groups == {u // UPG} for u, groups in encoded.items())


if __name__ == "__main__":
    cases = 0
    for UPG in (1, 2, 4, 8, 16, 32):
        for K in (1, 2, 4, 8, 16, 32):
            tile = 32 * K
            for n_units in sorted({tile, tile + UPG, 3 * tile - UPG, 5 * tile, 7 * tile + 3 * UPG}):
                check(UPG, K, n_units)
                cases += 1
    print(f"{cases} cases (UPG, K in 1..32, one to seven tiles), all units and groups as expected")
