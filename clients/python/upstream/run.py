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
    name: str  # the distribution on PyPI, as expected.txt names the suite
    package: str  # the library's source directory in the sdist, removed before the run
    adapter: str  # redis-tb's conftest for it, in this directory
    paths: tuple[str, ...]  # what pytest runs, relative to the sdist's root


SUITES = (
    Suite("limits", "limits", "conftest_limits.py", ("tests/test_strategy.py", "tests/aio/test_strategy.py")),
    Suite("Flask-Limiter", "flask_limiter", "conftest_flask_limiter.py", ("tests",)),
)


@dataclass
class Listed:
    failing: dict[str, str]  # test id -> reason
    not_run: dict[str, str]  # pytest node id or path -> reason


def read_expected() -> dict[str, Listed]:
    """expected.txt: `suite | fail | test id | reason` and `suite | skip | node id or path | reason` lines."""
    listed = {suite.name: Listed({}, {}) for suite in SUITES}
    for number, line in enumerate(EXPECTED.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split(" | ")]
        if len(fields) != 4 or fields[0] not in listed or fields[1] not in ("fail", "skip") or not fields[3]:
            sys.exit(f"{EXPECTED.name}:{number}: expected `suite | fail or skip | test | reason`, got: {line}")
        suite, kind, test, reason = fields
        (listed[suite].failing if kind == "fail" else listed[suite].not_run)[test] = reason
    return listed


def unpack(suite: Suite, version: str) -> Path:
    """The suite's sdist, unpacked afresh under target/upstream/, with redis-tb's adapter in place."""
    downloads = SCRATCH / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    spec = f"{suite.name}=={version}"
    sdists = [path for path in downloads.glob("*.tar.gz") if path.name.lower().startswith(f"{suite.package}-{version}")]
    if not sdists:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", downloads, spec],
            check=True,
        )
        sdists = [path for path in downloads.glob("*.tar.gz") if path.name.lower().startswith(f"{suite.package}-")]
        sdists = [path for path in sdists if path.name[len(suite.package) + 1 :].startswith(version)]
    root = SCRATCH / f"{suite.package}-{version}"
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(sdists[0]) as archive:
        archive.extractall(SCRATCH, filter="data")
    shutil.rmtree(root / suite.package)
    tests = root / "tests"
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


def run(suite: Suite, listed: Listed) -> bool:
    version = importlib.metadata.version(suite.name)
    root = unpack(suite, version)
    report = SCRATCH / f"{suite.package}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", HERE / "pytest.ini"]
    command += ["--rootdir", root, "--junitxml", report, "-o", "junit_family=xunit1", *suite.paths]
    for test in listed.not_run:
        command += ["--ignore" if test.endswith(".py") or "::" not in test else "--deselect", test]
    env = dict(os.environ, PYTHONPATH=str(HERE), TB_PYTHON_TESTS=str(HERE.parent / "tests"))
    log = SCRATCH / f"{suite.package}.log"
    with log.open("w") as output:
        subprocess.run([str(part) for part in command], cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT)
    results = outcomes(report)
    failed = {test for test, outcome in results.items() if outcome == "failed"}
    passed = sum(outcome == "passed" for outcome in results.values())
    skipped = sum(outcome == "skipped" for outcome in results.values())
    unexpected = sorted(test for test in failed if listing(test) not in listed.failing)
    fixed = sorted(test for test, outcome in results.items() if outcome == "passed" and listing(test) in listed.failing)
    missing = sorted(set(listed.failing) - {listing(test) for test in results})
    print(
        f"{suite.name} {version}: ran {len(results)}, passed {passed}, failed {len(failed)}"
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
    listed = read_expected()
    chosen = [suite for suite in SUITES if not sys.argv[1:] or suite.name in sys.argv[1:]]
    results = [run(suite, listed[suite.name]) for suite in chosen]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
