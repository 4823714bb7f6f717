"""Argument types the subcommands share (argparse `type=` callables)."""

from __future__ import annotations

import argparse

from mfuscope.core.settings import parse_quantity

__all__ = ["positive_quantity", "quantity"]


def quantity(text: str) -> float:
    """A number, optionally with a k/M/G(B)/T/P suffix: ``70B`` = 7e10, ``989.4T`` = 9.894e14
    (`core.settings.parse_quantity`)."""
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_quantity(text: str) -> float:
    """A `quantity` > 0."""
    value = quantity(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value
