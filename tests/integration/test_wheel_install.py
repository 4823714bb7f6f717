"""The wheel is the product: build it from the checkout, install it with its extras in a fresh
virtual environment outside the checkout, and run every subcommand from there.

The suite otherwise runs against the editable install, which maps the source folders directly
and so cannot see a module, subpackage or data file the wheel leaves out (the hand-kept package
list once shipped without `mfuscope.core.aggregate` and `mfuscope.cli.validate_gpu`: `report`
crashed and `validate-gpu` was an "invalid choice", from the wheel only).

Dependencies are pinned to the versions of the environment running the suite (constraints):
the check is of mfuscope's packaging, and a range such as the agent extra's `torch>=2.4` would
otherwise let pip pick a newer CUDA build of torch (gigabytes) where the CPU build lies on disk.
They are not copied either: the fresh environment sees those of the suite's installed
distributions that the wheel's extras require (and those alone) through a `.pth` file, so pip
resolves the extras against them and installs the wheel alone (copying torch and the rest took
about two minutes of the suite). The environment has no pip of its own: the suite's pip installs
into it (``pip --python``).
Everything in one test: the build and the install happen once, whichever xdist worker runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from mfuscope.cli import SUBCOMMANDS
from mfuscope.core.schema import ReportBatch, StepReport, encode_batch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "gloo-ddp-2rank"
# The layers setup.py maps onto mfuscope.<folder> (docs/architecture.md#layers).
LAYERS = ("core", "agent", "collector", "exporters", "cli", "integrations")
_IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache", "out"
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    work: Path  # a folder outside the checkout: the subcommands' working directory

    def run(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """`mfuscope ARGV` from the installed wheel, outside the checkout, with no PYTHONPATH."""
        return subprocess.run(
            [str(self.venv / "bin" / "mfuscope"), *argv],
            cwd=self.work,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "python"), "-c", code],
            cwd=self.work,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _source_files() -> list[str]:
    """What the checkout holds (tracked or new and not ignored), relative to the root."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())
    return sorted(  # a copy without git: every file but the ignored folders
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and not _IGNORED(str(p.parent), [p.name]) and ".venv" not in p.parts
    )


def _copy_source(destination: Path) -> list[str]:
    """Copy the checkout's files to `destination` (never a stale build/ folder) and list them."""
    files = _source_files()
    for name in files:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return files


def _step(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"{what} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Installed, list[str]]:
    base = tmp_path_factory.mktemp("wheel")
    source, dist, venv, work = base / "source", base / "dist", base / "venv", base / "work"
    work.mkdir()
    files = _copy_source(source)
    # No build isolation: setuptools comes from the suite's environment, no network needed.
    _step(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        "building the wheel",
    )
    (wheel,) = dist.glob("mfuscope-*.whl")
    declared = _declared_distributions(("agent", "report"))
    constraints = base / "constraints.txt"
    constraints.write_text("".join(f"{d.metadata['Name']}=={d.version}\n" for d in declared))
    # No pip of its own (bundling one took ~11 s): the suite's pip installs into it (--python).
    _step(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        "creating the virtual environment",
    )
    _share_dependencies(venv, base / "dependencies", declared)
    _step(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-input",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            f"{wheel}[agent,report]",
        ],
        "installing the wheel with its agent and report extras",
        cwd=work,
    )
    return Installed(wheel, venv, work), files


def _declared_distributions(extras: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions mfuscope with `extras` requires, directly or not (without
    mfuscope itself): what pip would install beside the wheel."""
    wanted: dict[str, set[str]] = {}
    found: dict[str, metadata.Distribution] = {}
    todo = [("mfuscope", set(extras))]
    while todo:
        name, name_extras = todo.pop()
        key = canonicalize_name(name)
        if key in wanted and name_extras <= wanted[key]:
            continue
        wanted.setdefault(key, set()).update(name_extras)
        dist = found.setdefault(key, metadata.distribution(name))
        for text in dist.requires or []:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in wanted[key]] or [{"extra": ""}]
            if requirement.marker is None or any(
                requirement.marker.evaluate(env) for env in environments
            ):
                todo.append((requirement.name, set(requirement.extras)))
    del found["mfuscope"]
    return list(found.values())


def _share_dependencies(venv: Path, folder: Path, declared: list[metadata.Distribution]) -> None:
    """Make the distributions the wheel's extras require importable in `venv` and visible to
    its pip, from the suite's environment: links to their files in `folder` (those alone, so a
    dependency the wheel does not declare is still missing), named by a `.pth` file of the venv
    (after its own site-packages, so the wheel's mfuscope comes first)."""
    folder.mkdir()
    for dist in declared:
        site_packages = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            if not (folder / top).exists() and (site_packages / top).exists():
                (folder / top).symlink_to(site_packages / top)
    (venv_site,) = (venv / "lib").glob("python*/site-packages")
    (venv_site / "suite_dependencies.pth").write_text(f"{folder}\n", encoding="utf-8")


def _failures_of_subcommands(inst: Installed) -> list[str]:
    """Run every subcommand from the installed wheel; the list of what went wrong."""
    failures: list[str] = []

    def check(ok: bool, what: str, result: subprocess.CompletedProcess[str]) -> None:
        if not ok:
            failures.append(
                f"{what}: rc={result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            )

    top = inst.run("--help")
    check(
        top.returncode == 0 and all(name in top.stdout for name in SUBCOMMANDS),
        "mfuscope --help lists every subcommand",
        top,
    )
    for name in SUBCOMMANDS:
        helped = inst.run(name, "--help")
        check(
            helped.returncode == 0 and f"usage: mfuscope {name}" in helped.stdout,
            f"mfuscope {name} --help",
            helped,
        )

    analyzed = inst.run("analyze", str(TRACES), "--json")
    ok = analyzed.returncode == 0
    if ok:
        document = json.loads(analyzed.stdout)
        steps = [step for rank in document["ranks"] for step in rank["steps"]]
        ok = sorted(rank["rank"] for rank in document["ranks"]) == [0, 1] and len(steps) == 4
    check(ok, "mfuscope analyze on the recorded 2-rank gloo traces", analyzed)

    out = inst.work / "report-out"
    # The page alone (its plots inline): the PNG copies, ~1 CPU-s more, add no module.
    reported = inst.run("report", str(TRACES), "--out", str(out), "--no-png")
    html = sorted(out.glob("*.html")) if out.is_dir() else []
    check(
        reported.returncode == 0 and bool(html) and all(p.stat().st_size > 0 for p in html),
        "mfuscope report on the recorded traces writes its HTML page",
        reported,
    )

    calculated = inst.run(
        "calc",
        "--params",
        "7B",
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--seq-len",
        "4096",
        "--global-batch",
        "512",
        "--devices",
        "8",
        "--device",
        "NVIDIA H100 80GB HBM3",
        "--dtype",
        "bf16",
        "--step-time",
        "30",
        "--json",
    )
    ok = calculated.returncode == 0
    if ok:
        mfu = json.loads(calculated.stdout).get("mfu")
        ok = isinstance(mfu, float) and 0 < mfu < 1
    check(ok, "mfuscope calc answers an MFU", calculated)

    validated = inst.run("validate-gpu", "--out", str(inst.work / "validate"))
    check(
        validated.returncode == 0
        and "no CUDA device: validate-gpu skipped" in validated.stderr + validated.stdout,
        "mfuscope validate-gpu without a GPU skips cleanly",
        validated,
    )

    data = inst.python(
        "from mfuscope.cli.demo._services import project_prometheus_dir as d; "
        "print((d() / 'prometheus.yml').is_file(), len(list((d() / 'rules').glob('*.yml'))))"
    )
    check(
        data.returncode == 0 and data.stdout.split() == ["True", "2"],
        "the demo's Prometheus config and rules ship in the wheel",
        data,
    )
    compiled = inst.python(
        "from mfuscope.core.trace._select import SELECTION_AVAILABLE as s; print(s)"
    )
    check(
        compiled.returncode == 0 and compiled.stdout.split() == ["True"],
        "the wheel's compiled part loads (the trace pre-filter)",
        compiled,
    )
    failures.extend(_failures_of_collector(inst))
    return failures


def _failures_of_collector(inst: Installed) -> list[str]:
    """The installed collector answers one POST of a report batch and one scrape."""
    address_file = inst.work / "collector-address"
    log = inst.work / "collector.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                str(inst.venv / "bin" / "mfuscope"),
                "collector",
                "--listen",
                "127.0.0.1:0",
                "--address-file",
                str(address_file),
            ],
            cwd=inst.work,
            env=_clean_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (address_file.exists() and address_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                return [f"the installed collector did not start:\n{log.read_text()[-2000:]}"]
            time.sleep(0.05)
        url = "http://" + address_file.read_text().strip()
        step = StepReport(
            step=1, start_unix_ns=time.time_ns(), wall_s=0.5, model_flops=1e12, recompute_flops=0.0
        )
        batch = ReportBatch(
            job="wheel-job",
            rank=0,
            world_size=1,
            host="h",
            device="cpu",
            peak_flops=1e13,
            peak_source="user",
            sent_unix_ns=time.time_ns(),
            reports=(step,),
        )
        request = urllib.request.Request(
            f"{url}/v1/reports",
            data=encode_batch(batch).decode().encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            posted = response.status
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if posted != 200 or 'mfuscope_steps_total{job="wheel-job"} 1.0' not in metrics:
        return [f"collector POST answered {posted}; scrape:\n{metrics[:2000]}"]
    return []


def test_every_subcommand_runs_from_the_installed_wheel(
    installed: tuple[Installed, list[str]],
) -> None:
    inst, _ = installed
    where = inst.python("import mfuscope.cli, mfuscope.core; print(mfuscope.cli.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(inst.venv), "imported from the checkout"
    failures = _failures_of_subcommands(inst)
    assert not failures, "\n\n".join(failures)


def test_the_wheel_holds_every_module_of_the_tree(installed: tuple[Installed, list[str]]) -> None:
    inst, files = installed
    import zipfile

    with zipfile.ZipFile(inst.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if name.startswith("mfuscope/")}
    expected = {
        f"mfuscope/{name}"
        for name in files
        if name.split("/")[0] in LAYERS and name.endswith((".py", "py.typed"))
    }
    missing = sorted(expected - shipped)
    assert not missing, f"the wheel lacks {missing}"
    assert {
        "mfuscope/deploy/prometheus/prometheus.yml",
        "mfuscope/deploy/prometheus/rules/mfuscope-recording.yml",
        "mfuscope/deploy/prometheus/rules/mfuscope-alerts.yml",
    } <= shipped


def test_every_subcommand_module_of_the_tree_is_a_subcommand() -> None:
    # A module under cli/ with add_arguments and run that SUBCOMMANDS lacks is never reachable.
    modules = {p.stem for p in (ROOT / "cli").glob("*.py") if not p.stem.startswith("_")}
    modules |= {p.parent.name for p in (ROOT / "cli").glob("*/__init__.py")}
    assert modules == {module for module, _ in SUBCOMMANDS.values()}


def test_the_image_installs_the_same_wheel(request: pytest.FixtureRequest) -> None:
    dockerfile = (ROOT / "deploy" / "image" / "Dockerfile").read_text()
    assert (
        "COPY dist/mfuscope-*.whl" in dockerfile
        and "pip wheel" not in dockerfile.split("FROM", 1)[1]
    ), "the image must install the built wheel, not build its own"
    docker = shutil.which("docker")
    info = subprocess.run([docker, "info"], capture_output=True, text=True) if docker else None
    if info is None or info.returncode != 0:
        pytest.skip("no container runtime here (docker info failed): the wheel alone is tested")
    # Built only now: a worker that skips must not build and install the wheel for nothing.
    inst, _ = request.getfixturevalue("installed")
    context = inst.wheel.parent.parent / "image-context"
    shutil.copytree(ROOT, context, ignore=_IGNORED)
    (context / "dist").mkdir()
    shutil.copy2(inst.wheel, context / "dist")
    _step(
        ["docker", "build", "-f", "deploy/image/Dockerfile", "-t", "mfuscope-test", "."],
        "docker build",
        cwd=context,
    )
