"""The demo's training job, instrumented with the mfuscope agent (imported by torchrun, never
eagerly).

`python -m mfuscope.cli.demo.job.train_demo` is the job `mfuscope demo` launches under torchrun:
a small GPT-style transformer trained with data parallelism over gloo (or a 2-stage pipeline with
`--pipeline`), with activation checkpointing on some layers. Importing this package does not import
torch; its modules do.
"""

from __future__ import annotations

__all__: list[str] = []
