"""The release tooling's pure parts: new_release.py's argument checks, index check,
scaffolding and source diff report; release_goldens.py's plan; compare_versions.py's
releases. No vLLM and no package index needed (the venv and goldens steps that
need them are run by hand, docs/adding_a_vllm_release.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (str(HERE), str(HERE / "vllm_0_34")):
    if folder not in sys.path:
        sys.path.insert(0, folder)

import compare_versions as cv  # noqa: E402
import new_release as nr  # noqa: E402
import release_goldens as regen  # noqa: E402


@pytest.mark.parametrize("version, minor", [("0.35.0", "0.35"), ("1.0.2", "1.0"), ("0.100.0", "0.100")])
def test_check_version_gives_major_minor(version: str, minor: str) -> None:
    assert nr.check_version(version) == minor


@pytest.mark.parametrize("version", ["0.35", "v0.35.0", "0.35.0rc1", "", "0.35.0 "])
def test_check_version_refuses_what_pip_would_not_pin(version: str) -> None:
    with pytest.raises(nr.ReleaseError, match=r"give vLLM's full release version, e\.g\. 0\.35\.0"):
        nr.check_version(version)


@pytest.mark.parametrize("name", ["../vllm_0_35", "vllm-0.35", "a/b", ""])
def test_check_folder_refuses_paths(name: str) -> None:
    with pytest.raises(nr.ReleaseError, match="folder"):
        nr.check_folder(name)


def test_check_folder_names_a_folder_under_conformance() -> None:
    assert nr.check_folder("vllm_0_35") == HERE / "vllm_0_35"


PIP_INDEX = """WARNING: pip index is currently an experimental command.
vllm (0.34.0)
Available versions: 0.34.0, 0.33.0, 0.32.0, 0.10.1.1
"""


def test_listed_versions_reads_pip_index_output() -> None:
    assert nr.listed_versions(PIP_INDEX) == ("0.34.0", "0.33.0", "0.32.0", "0.10.1.1")
    assert nr.listed_versions("ERROR: No matching distribution found for vllm\n") == ()


def test_a_release_not_on_the_index_is_refused_naming_the_newest() -> None:
    listed = nr.listed_versions(PIP_INDEX)
    nr.check_on_index("0.34.0", listed)
    with pytest.raises(nr.ReleaseError,
                       match=r"vllm 0\.35\.0 is not on the package index \(the newest there is 0\.34\.0\)"):
        nr.check_on_index("0.35.0", listed)
    # A prefix of a listed version is not that version.
    with pytest.raises(nr.ReleaseError, match=r"0\.10\.1 is not"):
        nr.check_on_index("0.10.1", listed)
    with pytest.raises(nr.ReleaseError, match="lists no vllm"):
        nr.check_on_index("0.35.0", ())


def test_main_reports_a_bad_version_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert nr.main(["goldens", "0.35", "vllm_0_35"]) == 2
    assert "version '0.35'" in capsys.readouterr().err


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_diff_sources_classifies_and_counts_lines(tmp_path: Path) -> None:
    old = _write(tmp_path / "old", {
        "v1/core/sched/scheduler.py": "a\nb\nc\n",
        "v1/core/sched/utils.py": "same\n",
        "v1/core/sched/gone.py": "x\ny\n",
        "v1/request.py": "r\n",
        "unrelated.py": "not on the path\n",
    })
    new = _write(tmp_path / "new", {
        "v1/core/sched/scheduler.py": "a\nB\nc\nd\n",
        "v1/core/sched/utils.py": "same\n",
        "v1/core/sched/fresh.py": "1\n2\n3\n",
        "v1/request.py": "r\n",
        "unrelated.py": "changed, but not on the path\n",
    })
    report = nr.diff_sources(old, new, "0.34.0", "0.35.0", ("v1/core/sched/*.py", "v1/request.py"))
    rows = {f.path: (f.status, f.old_lines, f.new_lines, f.added, f.removed) for f in report.files}
    assert rows == {
        "v1/core/sched/scheduler.py": ("changed", 3, 4, 2, 1),  # b -> B, d appended
        "v1/core/sched/utils.py": ("unchanged", 1, 1, 0, 0),
        "v1/core/sched/gone.py": ("removed", 2, 0, 0, 2),
        "v1/core/sched/fresh.py": ("added", 0, 3, 3, 0),
        "v1/request.py": ("unchanged", 1, 1, 0, 0),
    }
    summary = report.markdown()
    assert "5 files: 1 changed, 2 unchanged, 1 added, 1 removed; +5 / -3 lines." in summary
    assert "| v1/core/sched/scheduler.py | changed | 3 | 4 | 2 | 1 |" in summary
    # Changed files come first in the table.
    assert summary.index("scheduler.py") < summary.index("utils.py")
    unified = report.unified()
    assert "--- 0.34.0/vllm/v1/core/sched/scheduler.py" in unified
    assert "+++ 0.35.0/vllm/v1/core/sched/scheduler.py" in unified
    assert "-b\n+B\n" in unified and "unrelated" not in unified


def test_diff_sources_needs_two_package_folders(tmp_path: Path) -> None:
    with pytest.raises(nr.ReleaseError, match="installed vllm package"):
        nr.diff_sources(tmp_path / "missing", tmp_path, "0.34.0", "0.35.0")


def test_the_scheduler_path_covers_the_files_docs_vllm_versions_lists() -> None:
    for path in ("v1/core/sched/*.py", "v1/core/kv_cache_manager.py", "v1/engine/core.py",
                 "config/vllm.py", "v1/kv_offload/**/*.py"):
        assert path in nr.SCHEDULER_PATH


def test_scaffold_rewrites_the_release_strings(tmp_path: Path) -> None:
    src = _write(tmp_path / "vllm_0_34", {name: "" for name in nr.DRIVER_FILES})
    (src / "oracle.py").write_text(
        'VLLM_VERSION = "0.34.0"\nCACHE = "kvsched-reference-vllm-0.34-cache"\n'
        '# tests/conformance/vllm_0_34/oracle.py writes goldens_0_34; venv-0.34; 0.34 sends\n')
    dst = tmp_path / "vllm_0_35"
    assert nr.scaffold(src, dst, "0.34", "0.35") == list(nr.DRIVER_FILES)
    assert (dst / "oracle.py").read_text() == (
        'VLLM_VERSION = "0.35.0"\nCACHE = "kvsched-reference-vllm-0.35-cache"\n'
        # Prose about 0.34's behaviour is left for the reviewer.
        '# tests/conformance/vllm_0_35/oracle.py writes goldens_0_35; venv-0.35; 0.34 sends\n')
    with pytest.raises(nr.ReleaseError, match="exists"):
        nr.scaffold(src, dst, "0.34", "0.35")
    (src / "dp_goldens.py").unlink()
    with pytest.raises(nr.ReleaseError, match=r"no dp_goldens\.py"):
        nr.scaffold(src, tmp_path / "vllm_0_36", "0.34", "0.36")


def test_release_only_folders_take_earlier_releases_not_later(tmp_path: Path) -> None:
    for rel in ("vllm_0_34/probes/a.json", "vllm_0_34/rules_0_34/b.json", "vllm_0_35/rules_0_35/c.json",
                "vllm_0_36/rules_0_36/d.json", "vllm_0_35/empty/readme.txt"):
        _write(tmp_path, {rel: "{}"})
    names = [p.name for p in nr.release_only_folders("0.35", tmp_path / "vllm_0_35", tmp_path)]
    assert names == ["probes", "rules_0_34", "rules_0_35"]
    names = [p.name for p in nr.release_only_folders("0.34", tmp_path / "vllm_0_34", tmp_path)]
    assert names == ["probes", "rules_0_34"]


def test_the_034_plan_is_what_regenerate_always_replayed() -> None:
    plan = regen.make_plan("0.34")
    assert plan.release.goldens == cv.CONFORMANCE / "goldens_0_34"
    assert plan.drivers == cv.CONFORMANCE / "vllm_0_34"
    assert plan.folders == (*(f for f in cv.FOLDERS if f != "dp"), "admission_random", "probes",
                            "rules_0_34", "dp")
    assert regen.needs_engine_loop(plan.sources["pp"])
    assert regen.needs_engine_loop(plan.sources["rules_0_34"])
    assert not regen.needs_engine_loop(plan.sources["random_features"])
    assert regen.python_env_var("0.34") == "KVSCHED_REFERENCE_034_PYTHON"


def test_a_release_only_folder_may_not_shadow_a_corpus_folder(tmp_path: Path) -> None:
    _write(tmp_path, {"pp/x.json": json.dumps({})})
    with pytest.raises(ValueError, match="'pp' is taken"):
        regen.make_plan("0.35", drivers=tmp_path, extra=[tmp_path / "pp"])


@pytest.mark.parametrize("version", ["0.35.0", "035", "zero.35"])
def test_compare_versions_takes_major_minor(version: str) -> None:
    with pytest.raises(ValueError, match=r"major\.minor"):
        cv.release(version)


# ~6 s: the slow tier.
@pytest.mark.slow
def test_a_release_compared_with_itself_is_equal_everywhere() -> None:
    result = cv.compare_all(cv.RELEASE, cv.RELEASE)
    assert set(result) >= {"pp", "dp", "probes", "rules_0_34"}
    statuses = {row["status"] for folder, rows in result.items() for row in rows.values()
                if folder != "shared_examples" or cv.SHARED_EXAMPLES.is_dir()}
    assert statuses == {"equal"}
