"""`make test-upstream`: the test suites that ship in the sdists of `limits` and `Flask-Limiter`, run against
redis-tb's token-bucket strategy.

For each suite: download the sdist of the installed version from PyPI (`pip download --no-binary :all:`), unpack
it into target/upstream/ (build output, never committed), drop the library's own source (so the installed one is
tested), put redis-tb's adapter in place of the suite's conftest (which it imports), and run the suite's tests
with pytest. The expected failures and the tests not run are listed, each with its reason, in expected.txt
next to this file; the run passes when the failures are exactly the listed ones. Prints one line per suite:
ran, passed, failed, and what differs from the list.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCRATCH = REPO / "target" / "upstream"
EXPECTED = HERE / "expected.txt"


@dataclass(frozen=True)
class Suite:
    name: str  # the distribution on PyPI
    package: str  # the library's source directory in the sdist, removed before the run
    adapter: str  # redis-tb's conftest for it, in this directory
    paths: tuple[str, ...]  # what pytest runs, relative to the sdist's root
    sdist: bool = True  # False: its sdist has no tests; run only from a checkout given as `name=<directory>`
    variant: str = ""  # a second run of the same suite, named `<name> <variant>` here and in expected.txt
    clock: bool = False  # its server runs on the controlled clock (TB_UPSTREAM_CLOCK=1)

    @property
    def label(self) -> str:
        return f"{self.name} {self.variant}" if self.variant else self.name


SUITES = (
    Suite("limits", "limits", "conftest_limits.py", ("tests/test_strategy.py", "tests/aio/test_strategy.py")),
    Suite("Flask-Limiter", "flask_limiter", "conftest_flask_limiter.py", ("tests",)),
    Suite(
        "Flask-Limiter", "flask_limiter", "conftest_flask_limiter_redis.py", ("tests",), variant="on Redis", clock=True
    ),
    Suite("slowapi", "slowapi", "conftest_slowapi.py", ("tests",), sdist=False),
)


@dataclass
class Listed:
    failing: dict[str, str]  # test id -> reason
    not_run: dict[str, str]  # pytest node id or path -> reason


def read_expected() -> dict[str, Listed]:
    """expected.txt: `suite | fail | test id | reason` and `suite | skip | node id or path | reason` lines."""
    listed = {suite.label: Listed({}, {}) for suite in SUITES}
    for number, line in enumerate(EXPECTED.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split(" | ")]
        if len(fields) != 4 or fields[0] not in listed or fields[1] not in ("fail", "skip") or not fields[3]:
            sys.exit(f"{EXPECTED.name}:{number}: expected `suite | fail or skip | test | reason`, got: {line}")
        suite, kind, test, reason = fields
        (listed[suite].failing if kind == "fail" else listed[suite].not_run)[test] = reason
    return listed


def download(suite: Suite, version: str) -> Path:
    """The suite's sdist for `version`, unpacked afresh under target/upstream/."""
    downloads = SCRATCH / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)

    def found() -> list[Path]:
        prefix = f"{suite.package}-{version}".lower()
        return [path for path in downloads.glob("*.tar.gz") if path.name.lower().startswith(prefix)]

    if not found():
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d"]
        subprocess.run([*command, str(downloads), f"{suite.name}=={version}"], check=True)
    root = SCRATCH / f"{suite.package}-{version}"
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(found()[0]) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later: no member may land outside SCRATCH
            archive.extractall(SCRATCH, filter="data")
        else:
            archive.extractall(SCRATCH)
    if suite.variant:
        variant = root.with_name(f"{root.name}-{suite.variant.replace(' ', '-').lower()}")
        shutil.rmtree(variant, ignore_errors=True)
        root = root.rename(variant)
    return root


def copied(suite: Suite, checkout: Path) -> Path:
    """The tests of a checkout of the suite's repository, copied afresh under target/upstream/."""
    root = SCRATCH / f"{suite.package}-checkout"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(checkout / "tests", root / "tests")
    return root


def prepared(suite: Suite, version: str, checkout: Path | None) -> Path:
    """The suite's tests in target/upstream/, without the library's source (the installed one is tested), with
    redis-tb's adapter as their conftest (theirs, if any, kept as tests/upstream_conftest.py)."""
    root = download(suite, version) if checkout is None else copied(suite, checkout)
    shutil.rmtree(root / suite.package, ignore_errors=True)
    tests = root / "tests"
    if (tests / "conftest.py").exists():
        (tests / "conftest.py").rename(tests / "upstream_conftest.py")
    shutil.copy(HERE / suite.adapter, tests / "conftest.py")
    return root


def outcomes(report: Path) -> dict[str, str]:
    """Test id (`module.Class::test[param]`) -> passed, failed or skipped, from pytest's JUnit XML."""
    results: dict[str, str] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            results[test] = "failed"
        elif "skipped" in kinds:
            results.setdefault(test, "skipped")
        else:
            results.setdefault(test, "passed")
    return results


def listing(test: str) -> str:
    """How expected.txt names a test: its id, or its id without the parameters (every parametrization)."""
    return test.split("[", 1)[0]


def run(suite: Suite, listed: Listed, checkout: Path | None) -> bool:
    version = importlib.metadata.version(suite.name)
    root = prepared(suite, version, checkout)
    stem = suite.package + (f"-{suite.variant.replace(' ', '-').lower()}" if suite.variant else "")
    report = SCRATCH / f"{stem}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", HERE / "pytest.ini"]
    command += ["--rootdir", root, "--junitxml", report, "-o", "junit_family=xunit1", *suite.paths]
    for test in listed.not_run:
        command += ["--ignore" if test.endswith(".py") or "::" not in test else "--deselect", test]
    env = dict(os.environ, PYTHONPATH=str(HERE), TB_PYTHON_TESTS=str(HERE.parent / "tests"))
    env["TB_UPSTREAM_CLOCK"] = "1" if suite.clock else "0"
    log = SCRATCH / f"{stem}.log"
    with log.open("w") as output:
        subprocess.run([str(part) for part in command], cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT)
    results = outcomes(report)
    failed = {test for test, outcome in results.items() if outcome == "failed"}
    passed = sum(outcome == "passed" for outcome in results.values())
    skipped = sum(outcome == "skipped" for outcome in results.values())
    unexpected = sorted(test for test in failed if listing(test) not in listed.failing)
    fixed = sorted(test for test, outcome in results.items() if outcome == "passed" and listing(test) in listed.failing)
    missing = sorted(set(listed.failing) - {listing(test) for test in results})
    source = f" (tests of {checkout})" if checkout else ""
    print(
        f"{suite.label} {version}{source}: ran {len(results)}, passed {passed}, failed {len(failed)}"
        f"{f', skipped {skipped}' if skipped else ''}, not run {len(listed.not_run)} (listed); "
        f"{'as listed' if not (unexpected or fixed or missing) else 'NOT as listed'} (log: {log.relative_to(REPO)})"
    )
    for test in unexpected:
        print(f"  failed, not listed: {test}")
    for test in fixed:
        print(f"  listed as failing, passed: {test}")
    for test in missing:
        print(f"  listed as failing, did not run: {test}")
    return not (unexpected or fixed or missing)


def main() -> None:
    """`run.py` runs every suite whose sdist ships its tests; `run.py NAME...` those named, and `NAME=<directory>`
    a suite from a checkout of its repository (slowapi's sdist has no tests)."""
    listed = read_expected()
    chosen: dict[str, Path | None] = {}
    for argument in sys.argv[1:]:
        name, _, checkout = argument.partition("=")
        chosen[name] = Path(checkout).resolve() if checkout else None
    suites = [suite for suite in SUITES if suite.name in chosen or (not chosen and suite.sdist)]
    results = [run(suite, listed[suite.label], chosen.get(suite.name)) for suite in suites]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
