"""PromQL of mfuscope's job-level quantities, written once (docs/definitions.md#job-mfu).

`quantities` turns each definition of docs/definitions.md into a PromQL expression over the
collector's counters; `recording` is the recording rules built from them (the text of
deploy/prometheus/rules/mfuscope-recording.yml); `names` the recorded series the dashboards read;
`rules_file` writes rule groups as YAML. The dashboard generators build every formula panel from
`quantities` or read a recorded series, so a rule, a panel and an alert cannot disagree on a
formula. Pure: strings in, strings out, no file is read or written here.
"""

from __future__ import annotations

__all__: list[str] = []
