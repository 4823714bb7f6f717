"""One run of `mfuscope demo`: start the services and the job, follow it, summarise, report."""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mfuscope.cli.demo import _interrupt
from mfuscope.cli.demo._agent_tail import AgentTail
from mfuscope.cli.demo._live_view import DemoState, render, status_line
from mfuscope.cli.demo._procs import Child, Supervisor
from mfuscope.cli.demo._progress import apply_event, read_progress
from mfuscope.cli.demo._services import (
    CollectorProcess,
    ServiceError,
    http_get,
    start_collector,
    start_prometheus,
)
from rich.console import Console
from rich.live import Live

__all__ = ["DemoRun"]

STATUS_EVERY_S = 5.0
POLL_EVERY_S = 1.0
FINAL_ATTEMPTS = 3
FINAL_TIMEOUT_S = 10.0


class DemoRun:
    """Owns every process and temporary file of one demo run; `close()` releases them all."""

    def __init__(
        self,
        args: argparse.Namespace,
        job: str,
        default_listen: str,
        previous_peaks: tuple[tuple[float, str], ...] = (),
    ) -> None:
        self.args = args
        self.previous_peaks = previous_peaks  # of the demo run this one replaces in `out`
        self.job = job
        self.default_listen = default_listen
        self.out: Path = args.out
        self.console = Console(highlight=False)
        self.live_mode = not args.no_live and self.console.is_terminal
        self.supervisor = Supervisor()
        self.tmp: Path | None = None
        self.interrupted = False
        self.collector: CollectorProcess | None = None
        self.started = time.monotonic()
        self._last_status = 0.0
        self.agent_tail = AgentTail(self.out / "agent")
        mode = "2-stage pipeline (pp)" if args.pipeline else "data parallel (dp)"
        if args.pipeline and args.ranks > 2:
            mode += f" x dp {args.ranks // 2}"
        self.state = DemoState(
            job=job,
            mode=f"{mode}, {args.ranks} ranks, gloo",
            steps_target=args.steps,
            duration_s=None if args.steps is not None else args.duration,
        )

    # --- the run ---------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.state.notes.append(text)
        if not self.live_mode:
            print(f"[demo {time.monotonic() - self.started:5.1f} s] {text}", flush=True)

    def run(self) -> int:
        self.tmp = Path(tempfile.mkdtemp(prefix="mfuscope-demo-"))
        self.supervisor.cwd = self.tmp
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank: 2 ranks share 2 cores
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self.collector = self._start_collector(env)
        except ServiceError as exc:
            print(f"mfuscope demo: {exc}", file=sys.stderr)
            return 1
        self.state.metrics_url = f"{self.collector.url}/metrics"
        self.note(
            f"collector listening on {self.collector.url}; metrics at {self.state.metrics_url}"
        )
        if self.args.prometheus:
            self._start_prometheus(env)
        job = self._start_job(env)
        code = self._follow(job)
        final = self._final_summary()
        if code == 0 and self.args.hold:
            self._hold()
        self.supervisor.stop_all()
        if code != 0:
            print(
                f"mfuscope demo: the training job failed (exit code {code}); last lines of "
                f"{self.out / 'train.log'}:\n{self._train_log_tail()}",
                file=sys.stderr,
            )
            return 1
        from mfuscope.cli.demo._summary import print_summary, save_summary, write_demo_report

        report = None if self.args.no_report else write_demo_report(self.out, self.note)
        save_summary(self.out, final, report)
        print_summary(
            self.state,
            final,
            report,
            self.out,
            time.monotonic() - self.started,
            self.previous_peaks,
        )
        return 0

    def close(self) -> None:
        """Stop every child (and its process tree) and remove the temporary directory."""
        stopping = [c.name for c in reversed(self.supervisor.children) if c.running()]
        self.supervisor.stop_all()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        if self.interrupted:
            from mfuscope.cli.demo._summary import cli_command

            stopped = f"stopped {', '.join(stopping)}; " if stopping else ""
            print(
                f"\nmfuscope demo: interrupted: {stopped}temporary files removed. Partial agent "
                f"output is in {self.out / 'agent'} (`{cli_command()} report {self.out / 'agent'}` "
                "renders it).",
                file=sys.stderr,
            )

    # --- services ------------------------------------------------------------------------------

    def _start_collector(self, env: Mapping[str, str]) -> CollectorProcess:
        assert self.tmp is not None
        self.note("starting the collector…")
        log = self.out / "collector.log"
        listen = self.args.listen or self.default_listen
        try:
            return start_collector(self.supervisor, listen, self.tmp, log, env)
        except ServiceError:
            if self.args.listen is not None:
                raise
            self.note(f"{listen} is not available; using a free port instead")
            return start_collector(self.supervisor, "127.0.0.1:0", self.tmp, log, env)

    def _start_prometheus(self, env: Mapping[str, str]) -> None:
        assert self.tmp is not None and self.collector is not None
        try:
            url = start_prometheus(
                self.supervisor,
                self.args.prometheus_listen,
                self.collector.address,
                self.tmp,
                self.out / "prometheus.log",
                env,
            )
        except ServiceError as exc:
            self.note(f"Prometheus not started: {exc}")
            return
        self.state.prometheus_url = url
        self.note(f"Prometheus at {url} (project rules loaded, scraping the collector every 5 s)")

    # --- the job -------------------------------------------------------------------------------

    def _start_job(self, env: Mapping[str, str]) -> Child:
        assert self.collector is not None
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={self.args.ranks}",
            "-m", "mfuscope.cli.demo.job.train_demo",
            "--job", self.job,
            "--collector-url", self.collector.url,
            "--jsonl-dir", str((self.out / "agent").resolve()),
            "--log-every", "1",
        ]  # fmt: skip
        if self.args.steps is not None:
            argv += ["--steps", str(self.args.steps)]
            length = f"{self.args.steps} steps"
        else:
            argv += ["--max-seconds", str(self.args.duration)]
            length = f"about {self.args.duration:.0f} s of training"
        if self.args.pipeline:
            argv.append("--pipeline")
        self.note(f"launching torchrun: {self.state.mode}; {length}")
        self.state.phase = "launching torchrun"
        # torch leaves files in the temporary directory (torchrun's `torchelastic_*` logs, an
        # inductor cache): give the job one inside ours, which is removed at the end.
        assert self.tmp is not None
        job_tmp = self.tmp / "job"
        job_tmp.mkdir()
        job_env = {**env, "TMPDIR": str(job_tmp)}
        return self.supervisor.start("training job", argv, job_env, pipe_stdout=True)

    def _follow(self, job: Child) -> int:
        """Show progress until the job exits; returns its exit code."""
        events: queue.Queue[dict[str, Any]] = queue.Queue()
        assert job.popen.stdout is not None
        with (self.out / "train.log").open("ab") as log:
            reader = threading.Thread(
                target=read_progress, args=(job.popen.stdout, log, events), daemon=True
            )
            reader.start()
            if self.live_mode:
                with Live(render(self.state), console=self.console, refresh_per_second=4) as live:
                    self._loop(job, events, lambda: live.update(render(self.state)))
            else:
                self._loop(job, events, self._print_status)
            reader.join(timeout=10.0)
        self._apply(events)
        return int(job.popen.wait())

    def _loop(
        self, job: Child, events: queue.Queue[dict[str, Any]], show: Callable[[], None]
    ) -> None:
        next_poll = 0.0
        while job.running():
            _interrupt.check()
            self._apply(events)
            now = time.monotonic()
            self.state.elapsed_s = now - self.started
            if now >= next_poll:
                next_poll = now + POLL_EVERY_S
                self.supervisor.observe()
                self._poll_summary()
                self.state.breakdowns = self.agent_tail.poll()
            show()
            time.sleep(0.1)

    def _print_status(self) -> None:
        if self.state.step is not None and time.monotonic() - self._last_status >= STATUS_EVERY_S:
            self._last_status = time.monotonic()
            print(f"[demo {self.state.elapsed_s:5.1f} s] {status_line(self.state)}", flush=True)

    def _apply(self, events: queue.Queue[dict[str, Any]]) -> None:
        """Fold the job's progress events into the state."""
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                return
            apply_event(self.state, event, self.note, self.args.ranks)

    def _poll_summary(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        if self.collector is None:
            return None
        body = http_get(f"{self.collector.url}/v1/summary", timeout_s)
        if body is None:
            return None
        document: dict[str, Any] = json.loads(body)
        for entry in document.get("jobs", []):
            if entry.get("job") == self.job:
                self.state.summary = entry
        return document

    def _final_summary(self) -> dict[str, Any] | None:
        """The collector's last word: saved as summary.json and metrics.txt in the output.

        Patient (a busy machine can make a scrape take seconds) but bounded: a collector that does
        not answer costs the summary, not the run."""
        assert self.collector is not None
        document = metrics = None
        for _ in range(FINAL_ATTEMPTS):
            document = document or self._poll_summary(FINAL_TIMEOUT_S)
            metrics = metrics or http_get(f"{self.collector.url}/metrics", FINAL_TIMEOUT_S)
            if document is not None and metrics is not None:
                break
        if document is not None:
            (self.out / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
        else:
            self.note(
                f"the collector did not answer /v1/summary (see {self.out / 'collector.log'})"
            )
        if metrics is not None:
            (self.out / "metrics.txt").write_bytes(metrics)
        return document

    def _hold(self) -> None:
        where = self.state.prometheus_url or self.state.metrics_url
        self.note(f"training done; still serving {where}: press Ctrl-C to finish")
        try:
            while True:
                _interrupt.check()
                time.sleep(POLL_EVERY_S)
                self._poll_summary()
        except KeyboardInterrupt:
            self.note("finishing")

    def _train_log_tail(self, lines: int = 30) -> str:
        """From the first traceback in the job's log on (a worker's, `[rankN]:`-prefixed, comes
        before torchrun's own summary, which says little), else the log's last lines."""
        try:
            text = (self.out / "train.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        starts = [i for i, line in enumerate(text) if "Traceback (most recent call last)" in line]
        if starts:
            return "\n".join(text[starts[0] : starts[0] + lines])
        return "\n".join(text[-lines:])
