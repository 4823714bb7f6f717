"""The shape `sharded_flops_job.py` trains, torch-free: the test derives each layout's FLOPs by
hand from these constants without importing the job (and torch's distributed packages with it)."""

from __future__ import annotations

IN, HIDDEN, OUT, BATCH, SEQ = 64, 256, 32, 8, 4
STEPS = 3
MICROBATCHES = 2
VARYING_BATCHES = (8, 4, 8, 2, 6, 4, 2, 6, 8)
