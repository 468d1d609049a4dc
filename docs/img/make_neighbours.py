"""Draws docs/img/neighbours.png, the picture of "Privacy in plain words".

What a release looks like with one record and with that record replaced, at ε = 1 and ε = 8:
one Gaussian release of a class sum (rows clipped to norm 1, so one replaced record moves the
sum by at most 2), calibrated by dpda's analytic Gaussian at δ = 1e-4.
Run: python docs/img/make_neighbours.py (needs the bench extra, matplotlib).
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from scipy.stats import norm

from dpda.dp.calibration import sigma_analytic

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=False)
for ax, eps in zip(axes, (1.0, 8.0), strict=True):
    std = sigma_analytic(eps, 1e-4) * 2.0
    x = np.linspace(-4 * std - 1, 4 * std + 3, 600)
    ax.plot(x, norm.pdf(x, 0.0, std), label="with Alice's record")
    ax.plot(x, norm.pdf(x, 2.0, std), "--", label="with Alice's record replaced")
    guess = norm.cdf(1.0 / std)
    ax.set_title(f"ε = {eps:g}: noise std {std:.2f}; best guess right {guess:.0%}")
    ax.set_xlabel("released value (one coordinate of a class sum)")
    ax.set_yticks([])
axes[0].legend(loc="upper left", fontsize=8)
fig.tight_layout()
fig.savefig(Path(__file__).with_name("neighbours.png"), dpi=110)
