"""The read/write mode's hold lengths, shared by the Python-run holders
(holder.py, run_holder.py): the generator every face draws them with.
"""

M64 = (1 << 64) - 1


def rw_rng(who):
    """The Rust holder's generator of hold lengths (xorshift64*), seeded
    with FNV-1a of the id: the same sequence for the same id."""
    h = 0xCBF29CE484222325
    for b in who.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return [h or 0x9E3779B97F4A7C15]


def rw_units(st):
    """Units to hold for before the handover, in [20, 200]."""
    x = st[0]
    x ^= x >> 12
    x ^= (x << 25) & M64
    x ^= x >> 27
    st[0] = x
    return 20 + ((x * 0x2545F4914F6CDD1D) & M64) % 181
