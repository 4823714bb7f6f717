"""Builders, fakes and helpers shared by the tests: `trace_builder` (synthetic Kineto traces from
real event shapes), `agent_fakes` (stand-ins at the agent's boundaries), `agent_helpers` (stub
collectors and the 2-rank job of `agent_job`), `launch` (the jobs' torch-free launcher and their
command lines)."""
