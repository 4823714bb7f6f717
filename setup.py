"""The one compiled part: the optional trace-event pre-filter (core/trace/_select.c).

Everything else is configured in pyproject.toml. `optional=True`: without a C compiler the
build goes on without it and the analysis decodes every event (same results, slower).
"""

import os

from setuptools import Extension, setup

# POSIX threads: big traces are scanned in two halves at once.
threads = ["-pthread"] if os.name == "posix" else []

setup(
    ext_modules=[
        Extension(
            "mfuscope.core.trace._select_c",
            sources=["core/trace/_select.c"],
            extra_compile_args=["-O2", *threads],
            extra_link_args=threads,
            optional=True,
        )
    ]
)
