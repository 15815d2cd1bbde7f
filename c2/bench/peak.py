"""`python -m c2.bench.peak`: the machine's measured matmul peak (c2/train/peak.py), the
denominator of every MFU c2 reports, for float32 and bfloat16 on the default backend."""

import jax

from c2.train.peak import host_matmul_peak_flops

if __name__ == "__main__":
    for dt in ("float32", "bfloat16"):
        print(f"{jax.default_backend()} {dt}: {host_matmul_peak_flops(dt) / 1e9:.1f} GFLOP/s")
