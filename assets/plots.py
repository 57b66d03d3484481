"""Plots people would rather see than read: rendered once, logged to MLflow and embedded in
Dagster metadata (markdown with an inline PNG)."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt  # noqa: E402
from dagster import MetadataValue  # noqa: E402


def curves_png(history: list[dict], keys: list[str], title: str) -> bytes:
    """One panel per metric key against `step`."""
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.6), squeeze=False)
    steps = [h["step"] for h in history]
    for ax, key in zip(axes[0], keys):
        ax.plot(steps, [h.get(key, float("nan")) for h in history], marker=".", linewidth=1)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


def bars_png(labels: list[str], values: list[float], lows: list[float], highs: list[float], title: str) -> bytes:
    """pass@1 with CI error bars, one bar per checkpoint."""
    fig, ax = plt.subplots(figsize=(max(3.0, 0.8 * len(labels) + 1.5), 2.8))
    err = [[v - lo for v, lo in zip(values, lows)], [hi - v for v, hi in zip(values, highs)]]
    ax.bar(labels, values, yerr=err, capsize=4, color="#4a7ebb")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1 (sampled)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.tight_layout()
    return _png(fig)


def criteria_png(
    names: list[str], measured: list[float], thresholds: list[float], passed: list[bool], title: str
) -> bytes:
    """A bar per criterion (green: passed) with its threshold marked."""
    fig, ax = plt.subplots(figsize=(max(3.0, 0.9 * len(names) + 1.5), 2.8))
    colors = ["#4caf50" if ok else "#e53935" for ok in passed]
    ax.bar(names, measured, color=colors)
    ax.scatter(names, thresholds, marker="_", s=600, color="black", label="threshold", zorder=3)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.tight_layout()
    return _png(fig)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def markdown_image(png: bytes, alt: str) -> MetadataValue:
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")
