"""Measure the SFM's EXP and RECIP error vs float, over every representable input.

    .venv/bin/python -m benchmarks.sfm_accuracy [--preset default]

EXP: vs true exp over [cutoff, 0] (relative, and relative where exp(x) >= 1/64 so the
output LSB does not dominate), and vs the float PWL (absolute, the bit-accurate bound).
RECIP: relative error over all inputs up to 2^20 plus 10^6 random wider ones.
EXP2: relative error vs exp for every representable x in [-30, 0].
"""
from __future__ import annotations

import argparse

import torch

from golden.sfm import PRESETS, exp2, exp_pwl, exp_pwl_float, mantissa_value, recip, recip_relative_bound


def measure(cfg) -> dict:
    x = torch.arange(cfg.x_format.min_raw, 1)
    xf = cfg.x_format.to_float(x)
    y = cfg.out_format.to_float(exp_pwl(x, cfg)[0])
    inside = xf >= cfg.cutoff
    true = torch.exp(xf)
    rel = ((y - true) / true).abs()
    big = inside & (true >= 1 / 64)
    pwl_rel = ((exp_pwl_float(xf, cfg) - true) / true).abs()
    gen = torch.Generator().manual_seed(0)
    z = torch.cat([torch.arange(1, min(2 ** 20, 2 ** cfg.recip_in_width)),
                   torch.randint(1, 2 ** cfg.recip_in_width, (1_000_000,), generator=gen)])
    m, k = recip(z, cfg)
    rrel = (mantissa_value(m, k, cfg) * z.double() - 1).abs()
    x2 = torch.arange(max(cfg.x_format.min_raw, -(30 << cfg.x_frac)), 1)
    m2, k2 = exp2(x2, cfg)
    x2f = cfg.x_format.to_float(x2)
    erel = (mantissa_value(m2, k2, cfg) / torch.exp(x2f) - 1).abs()
    return {
        "exp_pwl_float_max_rel": float(pwl_rel[inside].max()),
        "exp_max_rel_in_range": float(rel[inside].max()),
        "exp_mean_rel_in_range": float(rel[inside].mean()),
        "exp_max_rel_where_exp_ge_1/64": float(rel[big].max()),
        "exp_max_abs_vs_float_pwl": float((y - exp_pwl_float(xf, cfg)).abs().max()),
        "recip_max_rel": float(rrel.max()),
        "recip_mean_rel": float(rrel.mean()),
        "recip_stated_bound": recip_relative_bound(cfg),
        "exp2_max_rel_x_in_[-30,0]": float(erel.max()),
        "exp2_mean_rel_x_in_[-30,0]": float(erel.mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=list(PRESETS), action="append")
    args = parser.parse_args()
    names = list(dict.fromkeys(args.preset or list(PRESETS)))
    rows = {name: measure(PRESETS[name]) for name in names}
    metrics = list(next(iter(rows.values())))
    print(f"| metric | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(names)}")
    for metric in metrics:
        print(f"| {metric} | {' | '.join(f'{rows[n][metric]:.3g}' for n in names)} |")


if __name__ == "__main__":
    main()
